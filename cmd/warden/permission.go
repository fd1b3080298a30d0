package main

import (
	"context"
	"errors"
	"sync"

	"github.com/wardenhq/warden/internal/natsconn"
)

// exitPermission: the server refused an operation to the credential used
// (a NATS permissions violation): use a credential whose role allows it
// (docs/security.md).
const exitPermission = 5

// permissions remembers the first permissions violation on the command's
// connection and stops the operation waiting on it: a refused request is
// dropped by the server, so waiting longer only turns the refusal into a
// misleading timeout.
type permissions struct {
	mu     sync.Mutex
	first  *natsconn.PermissionError
	cancel context.CancelCauseFunc
}

func (p *permissions) denied(pe *natsconn.PermissionError) {
	p.mu.Lock()
	if p.first == nil {
		p.first = pe
	}
	cancel := p.cancel
	p.mu.Unlock()
	if cancel != nil {
		cancel(pe)
	}
}

// bind makes ctx end when the server refuses something.
func (p *permissions) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	p.mu.Lock()
	p.cancel = cancel
	first := p.first
	p.mu.Unlock()
	if first != nil {
		cancel(first)
	}
	return ctx, func() { cancel(context.Canceled) }
}

// explain returns err as the permission error that caused it, if any.
func (p *permissions) explain(err error) error {
	if err == nil {
		return nil
	}
	var pe *natsconn.PermissionError
	if errors.As(err, &pe) {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.first == nil {
		return err
	}
	c := *p.first
	c.Err = err
	return &c
}
