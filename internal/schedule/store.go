package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// Store reads and writes schedule definitions and arms their timers.
type Store struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	now    func() time.Time

	// mu guards the server clock's offset from this host's, measured at
	// most every clockEvery (serverTime).
	mu       sync.Mutex
	offset   time.Duration
	offsetAt time.Time // zero: not measured yet
}

// clockEvery is how long a measured offset of the server's clock is used
// before it is measured again: a clock drifts by far less than a
// schedule's grace in that time, and measuring it at every tick was a
// stream info request each.
const clockEvery = 30 * time.Second

// NewStore opens WARDEN_SCHEDULES (streams.EnsureWorkflow creates it).
func NewStore(ctx context.Context, js jetstream.JetStream) (*Store, error) {
	st, err := js.Stream(ctx, streams.StreamSchedules)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", streams.StreamSchedules, err)
	}
	return &Store{js: js, stream: st, now: time.Now}, nil
}

// ErrExists is returned by Add when the name is taken and replace is false.
var ErrExists = errors.New("schedule exists")

// ErrNotFound is returned for a schedule that does not exist.
var ErrNotFound = errors.New("schedule not found")

// ErrUndecodable is returned (wrapped) for a definition that is not one:
// written by hand or by another version. List returns the others with it.
var ErrUndecodable = errors.New("schedule definition undecodable")

// Add stores d and arms its first tick, returning when that is. With
// replace, an existing schedule of the same name is replaced (its pending
// tick is dropped) and keeps its pause: a paused schedule replaced stays
// paused, with its reason and time. The pause fields of d are ignored.
func (s *Store) Add(ctx context.Context, d Definition, replace bool) (time.Time, error) {
	if d.CreatedAt.IsZero() {
		// By the server's clock, as every tick is: an @every schedule's
		// anchor taken from a host clock running ahead put its first tick
		// that far out, whatever the interval.
		now, err := s.serverTime(ctx)
		if err != nil {
			return time.Time{}, err
		}
		d.CreatedAt = now.UTC()
	}
	d.Paused, d.PauseReason, d.PausedAt = false, "", time.Time{}
	e, err := d.Validate()
	if err != nil {
		return time.Time{}, err
	}
	var rev uint64
	if replace {
		// Written on the condition that the definition read is still the
		// last, so that a pause (or resume) meanwhile is not lost: it is
		// read again and carried over.
		var w Entry
		w, _, err = s.writeDef(ctx, d.Name, func(cur *Definition) (Definition, error) {
			n := d
			if cur != nil {
				n.Paused, n.PauseReason, n.PausedAt = cur.Paused, cur.PauseReason, cur.PausedAt
			}
			return n, nil
		})
		rev = w.Rev
	} else {
		rev, err = s.publishDef(ctx, d, 0)
		if streams.LostCAS(err) {
			return time.Time{}, fmt.Errorf("%w: %s (remove it first, or replace it)", ErrExists, d.Name)
		}
	}
	if err != nil {
		return time.Time{}, err
	}
	next, err := s.armNext(ctx, d.Name, rev, e)
	if errors.Is(err, errChanged) {
		return time.Time{}, fmt.Errorf("schedule %s was replaced or removed while it was being added", d.Name)
	}
	return next, err
}

// armNext arms revision rev of schedule name for the first tick of x after
// now by the server's clock, and returns it; errChanged if rev is no
// longer the schedule's definition (its writer arms its own).
func (s *Store) armNext(ctx context.Context, name string, rev uint64, x Expr) (time.Time, error) {
	now, err := s.serverTime(ctx)
	if err != nil {
		return time.Time{}, err
	}
	next := x.Next(now)
	return next, arm(ctx, s.js, name, rev, next, time.Time{})
}

// publishDef writes d on the condition that the last definition of its
// name is at rev (0: there is none), returning its new revision. A lost
// condition is an error streams.LostCAS recognises.
func (s *Store) publishDef(ctx context.Context, d Definition, rev uint64) (uint64, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return 0, err
	}
	msg := nats.NewMsg(protocol.ScheduleDefSubject(d.Name))
	msg.Data = b
	ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(rev))
	if streams.LostCAS(err) {
		return 0, err
	}
	if err != nil {
		return 0, fmt.Errorf("store schedule %s: %w", d.Name, err)
	}
	return ack.Sequence, nil
}

// writeAttempts bounds writeDef's read-decide-write rounds: each lost
// one means another writer wrote the definition in between.
const writeAttempts = 10

// errNoChange, returned by a writeDef change, leaves the definition as
// it is.
var errNoChange = errors.New("no change")

// writeDef reads the definition of name (nil when there is none), lets
// change decide what to write, and writes it on the condition that the
// definition read is still the last; a lost condition reads and decides
// again. It returns the definition written and its revision, or, when
// change said errNoChange, the one read and false.
func (s *Store) writeDef(ctx context.Context, name string, change func(cur *Definition) (Definition, error)) (Entry, bool, error) {
	for range writeAttempts {
		var (
			cur *Definition
			e   Entry
		)
		switch got, err := s.Get(ctx, name); {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return Entry{}, false, err
		default:
			e = got
			cur = &e.Definition
		}
		d, err := change(cur)
		if errors.Is(err, errNoChange) {
			return e, false, nil
		}
		if err != nil {
			return Entry{}, false, err
		}
		rev, err := s.publishDef(ctx, d, e.Rev)
		if streams.LostCAS(err) {
			continue
		}
		if err != nil {
			return Entry{}, false, err
		}
		return Entry{Definition: d, Rev: rev}, true, nil
	}
	return Entry{}, false, fmt.Errorf("store schedule %s: written by others %d times in a row while this write was decided", name, writeAttempts)
}

// errChanged: arm found the definition replaced or removed.
var errChanged = errors.New("schedule definition changed")

// arm publishes the one-shot message schedule that fires the tick at t
// for the definition at rev. The timer subject holds one message, so
// arming again replaces the timer; the publish is conditional on rev
// still being the definition's last sequence, so that a relay still
// handling a tick of a replaced or removed definition cannot replace the
// timer of the new one (or leave one behind a removed schedule): that
// returns errChanged.
func arm(ctx context.Context, js jetstream.JetStream, name string, rev uint64, t, after time.Time) error {
	msg := nats.NewMsg(protocol.ScheduleTimerSubject(name))
	if !after.IsZero() {
		msg.Header.Set(protocol.HeaderScheduleAfter, after.UTC().Format(time.RFC3339Nano))
	}
	msg.Header.Set(protocol.HeaderNatsSchedule, "@at "+t.UTC().Format(time.RFC3339Nano))
	msg.Header.Set(protocol.HeaderNatsScheduleTarget, protocol.ScheduleTickSubject(name))
	msg.Header.Set(protocol.HeaderSchedule, name)
	msg.Header.Set(protocol.HeaderScheduleTick, t.UTC().Format(time.RFC3339Nano))
	msg.Header.Set(protocol.HeaderScheduleRev, strconv.FormatUint(rev, 10))
	_, err := js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequenceForSubject(rev, protocol.ScheduleDefSubject(name)))
	if streams.LostCAS(err) {
		return fmt.Errorf("arm schedule %s at revision %d: %w", name, rev, errChanged)
	}
	if err != nil {
		return fmt.Errorf("arm schedule %s for %s: %w", name, t.Format(time.RFC3339), err)
	}
	return nil
}

// serverTime is the time by the NATS server's clock, the one it fires
// message schedules by: when a tick is due, how late it is handled and
// when the next one falls are all decided by it, never by this host's
// clock, which may be off by more than a schedule's grace or interval.
// The local clock only measures the round trip (half of it is added) and
// carries the offset measured for clockEvery; a server that does not say
// its time leaves the local clock.
func (s *Store) serverTime(ctx context.Context) (time.Time, error) {
	s.mu.Lock()
	offset, at := s.offset, s.offsetAt
	s.mu.Unlock()
	if now := s.now(); !at.IsZero() && now.Sub(at) < clockEvery && now.Sub(at) >= 0 {
		return now.Add(offset), nil
	}
	sent := s.now()
	info, err := s.stream.Info(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("read the server's clock: %w", err)
	}
	got := s.now()
	if info.TimeStamp.IsZero() {
		return got, nil
	}
	server := info.TimeStamp.Add(max(got.Sub(sent), 0) / 2)
	s.mu.Lock()
	s.offset, s.offsetAt = server.Sub(got), got
	s.mu.Unlock()
	return server, nil
}

// Entry is a schedule as listed.
type Entry struct {
	Definition
	// Rev is the definition's stream sequence.
	Rev uint64 `json:"rev"`
	// Next is when the armed timer fires (zero if none is armed).
	Next time.Time `json:"next,omitzero"`
	// LastTick is the last tick that fired (zero if none yet).
	LastTick time.Time `json:"last_tick,omitzero"`

	// timerRev is the definition revision the armed timer is of, and
	// armedAfter the tick it was armed after relaying (HeaderScheduleAfter;
	// zero for a timer armed otherwise).
	timerRev   uint64
	armedAfter time.Time
	// tickSeq is the stream sequence of the last fired tick (0: none).
	tickSeq uint64
}

// timerCurrent says the armed timer is the definition's.
func (e Entry) timerCurrent() bool { return !e.Next.IsZero() && e.timerRev == e.Rev }

// Get returns the schedule name.
func (s *Store) Get(ctx context.Context, name string) (Entry, error) {
	m, err := s.stream.GetLastMsgForSubject(ctx, protocol.ScheduleDefSubject(name))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Entry{}, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return Entry{}, fmt.Errorf("read schedule %s: %w", name, err)
	}
	var e Entry
	if err := json.Unmarshal(m.Data, &e.Definition); err != nil {
		return Entry{}, fmt.Errorf("%w: %s: %w", ErrUndecodable, name, err)
	}
	e.Rev = m.Sequence
	if t, err := s.stream.GetLastMsgForSubject(ctx, protocol.ScheduleTimerSubject(name)); err == nil {
		e.Next, _ = time.Parse(time.RFC3339Nano, t.Header.Get(protocol.HeaderScheduleTick))
		e.timerRev, _ = strconv.ParseUint(t.Header.Get(protocol.HeaderScheduleRev), 10, 64)
		e.armedAfter, _ = time.Parse(time.RFC3339Nano, t.Header.Get(protocol.HeaderScheduleAfter))
	}
	if t, err := s.stream.GetLastMsgForSubject(ctx, protocol.ScheduleTickSubject(name)); err == nil {
		e.LastTick, _ = time.Parse(time.RFC3339Nano, t.Header.Get(protocol.HeaderScheduleTick))
		e.tickSeq = t.Sequence
	}
	return e, nil
}

// List returns every schedule, by name. Definitions that cannot be
// decoded are left out and named in the error (ErrUndecodable), returned
// with the others: one bad definition hid every schedule from
// `warden schedule ls` and stopped the relays' reconcile.
func (s *Store) List(ctx context.Context) ([]Entry, error) {
	prefix := protocol.ScheduleDefSubject("")
	info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter(prefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("list schedules: %w", err)
	}
	var (
		out []Entry
		bad []error
	)
	for subj := range info.State.Subjects {
		e, err := s.Get(ctx, strings.TrimPrefix(subj, prefix))
		switch {
		case errors.Is(err, ErrNotFound):
			continue // removed meanwhile
		case errors.Is(err, ErrUndecodable):
			bad = append(bad, err)
			continue
		case err != nil:
			return nil, err
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(bad, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return out, errors.Join(bad...)
}

// Remove deletes the schedule: its definition, its timer and its last
// tick. A tick already being relayed finds no definition and is dropped.
func (s *Store) Remove(ctx context.Context, name string) error {
	if _, err := s.stream.GetLastMsgForSubject(ctx, protocol.ScheduleDefSubject(name)); err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		return err
	}
	for _, subj := range []string{protocol.ScheduleDefSubject(name), protocol.ScheduleTimerSubject(name), protocol.ScheduleTickSubject(name)} {
		if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
			return fmt.Errorf("remove schedule %s: %w", name, err)
		}
	}
	return nil
}
