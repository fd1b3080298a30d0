package natsconn

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// PermissionError is a permissions violation the server reported: the
// connection's identity may not publish to (or subscribe to) Subject. It
// matches nats.ErrPermissionViolation with errors.Is.
type PermissionError struct {
	// Op is "publish" or "subscribe".
	Op string
	// Subject is the subject refused.
	Subject string
	// Identity is the credential's user name (or the connection name).
	Identity string
	// Err is the operation's own error (often a timeout: the server drops
	// a refused request), when known.
	Err error
}

func (e *PermissionError) Error() string {
	return fmt.Sprintf("permission denied: NATS identity %q may not %s %q (see docs/security.md for what each credential may do)",
		e.Identity, e.Op, e.Subject)
}

func (e *PermissionError) Unwrap() []error {
	if e.Err != nil {
		return []error{nats.ErrPermissionViolation, e.Err}
	}
	return []error{nats.ErrPermissionViolation}
}

var permissionRE = regexp.MustCompile(`(?i)(publish|subscription) to "([^"]*)"`)

// parsePermission turns the server's -ERR text into a PermissionError.
func parsePermission(err error, identity string) *PermissionError {
	pe := &PermissionError{Op: "publish", Identity: identity}
	if m := permissionRE.FindStringSubmatch(err.Error()); m != nil {
		if strings.EqualFold(m[1], "subscription") {
			pe.Op = "subscribe"
		}
		pe.Subject = m[2]
	}
	return pe
}

// tracker keeps a connection's permission violations.
type tracker struct {
	identity string
	log      zerolog.Logger

	mu        sync.Mutex
	last      *PermissionError
	at        time.Time
	logged    map[string]time.Time
	listeners map[int]func(*PermissionError)
	next      int
}

var trackers sync.Map // *nats.Conn → *tracker

func trackerOf(nc *nats.Conn) *tracker {
	if nc == nil {
		return nil
	}
	if t, ok := trackers.Load(nc); ok {
		return t.(*tracker)
	}
	return nil
}

// logEvery bounds how often one refused subject is logged, so that a
// process retrying an operation does not flood its log.
const logEvery = time.Minute

func (t *tracker) asyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		ev := t.log.Warn().Err(err)
		if sub != nil {
			ev = ev.Str("subject", sub.Subject)
		}
		ev.Msg("nats error")
		return
	}
	pe := parsePermission(err, t.identity)
	now := time.Now()
	t.mu.Lock()
	t.last, t.at = pe, now
	key := pe.Op + " " + pe.Subject
	logIt := now.Sub(t.logged[key]) >= logEvery
	if logIt {
		if t.logged == nil {
			t.logged = map[string]time.Time{}
		}
		t.logged[key] = now
	}
	ls := make([]func(*PermissionError), 0, len(t.listeners))
	for _, f := range t.listeners {
		ls = append(ls, f)
	}
	t.mu.Unlock()
	if logIt {
		t.log.Error().Str("identity", pe.Identity).Str("op", pe.Op).Str("subject", pe.Subject).
			Msg("nats permission denied")
	}
	for _, f := range ls {
		f(pe)
	}
}

// LastPermissionError returns the connection's latest permissions violation
// and when it happened (nil if none).
func LastPermissionError(nc *nats.Conn) (*PermissionError, time.Time) {
	t := trackerOf(nc)
	if t == nil {
		return nil, time.Time{}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.last == nil {
		return nil, time.Time{}
	}
	c := *t.last
	return &c, t.at
}

// OnPermissionError calls f for each permissions violation reported on nc
// until the returned function is called. A command uses it to stop waiting
// for a reply the server will never let through.
func OnPermissionError(nc *nats.Conn, f func(*PermissionError)) (stop func()) {
	t := trackerOf(nc)
	if t == nil {
		return func() {}
	}
	t.mu.Lock()
	id := t.next
	t.next++
	if t.listeners == nil {
		t.listeners = map[int]func(*PermissionError){}
	}
	t.listeners[id] = f
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		delete(t.listeners, id)
		t.mu.Unlock()
	}
}

// Explain returns err as a *PermissionError (wrapping err) when the server
// refused something on nc since since, so that a timeout caused by a
// refusal is reported as the refusal. Otherwise it returns err.
func Explain(nc *nats.Conn, since time.Time, err error) error {
	if err == nil {
		return nil
	}
	var pe *PermissionError
	if errors.As(err, &pe) {
		return err
	}
	last, at := LastPermissionError(nc)
	if last == nil || at.Before(since) {
		return err
	}
	last.Err = err
	return last
}

// identity is who a connection is and which inbox prefix it uses.
type identity struct {
	name  string
	inbox string
}

var nonToken = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// identify reads the user JWT of the credentials file (if any): its name,
// and the inbox prefix it may subscribe to.
func identify(o Options) (identity, error) {
	id := identity{name: o.Name}
	if o.Creds != "" {
		b, err := os.ReadFile(o.Creds)
		if err != nil {
			return id, fmt.Errorf("credentials: %w", err)
		}
		tok, err := jwt.ParseDecoratedJWT(b)
		if err != nil {
			return id, fmt.Errorf("credentials %s: %w", o.Creds, err)
		}
		uc, err := jwt.DecodeUserClaims(tok)
		if err != nil {
			return id, fmt.Errorf("credentials %s: %w", o.Creds, err)
		}
		if uc.Name != "" {
			id.name = uc.Name
		}
		for _, s := range uc.Permissions.Sub.Allow {
			if strings.HasPrefix(s, "_INBOX.") && strings.HasSuffix(s, ".>") && !strings.Contains(s[:len(s)-2], "*") {
				id.inbox = strings.TrimSuffix(s, ".>")
				break
			}
		}
	}
	if id.name == "" {
		id.name = "warden"
	}
	switch {
	case o.InboxPrefix != "":
		id.inbox = o.InboxPrefix
	case id.inbox == "":
		tok := strings.Trim(nonToken.ReplaceAllString(id.name, "_"), "_")
		if tok == "" {
			tok = "warden"
		}
		id.inbox = "_INBOX." + tok
	}
	return id, nil
}
