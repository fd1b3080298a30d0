package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/wardenhq/warden/internal/logging"
	"github.com/wardenhq/warden/pkg/protocol"
)

// ErrAdvanceFailed: no scheduler advanced the job (none answered in time,
// or the one that answered reported an error). The recovery loop asks
// again later.
var ErrAdvanceFailed = errors.New("advance request failed")

// advancer asks a scheduler to advance a job. The supervisor never
// dispatches: it releases steps through the job store and leaves every
// dispatch decision (selection, health, strategies, step defaults) to the
// schedulers, which answer requests on protocol.SubjectControlAdvance.
//
// Jobs whose request failed outside the recovery loop are queued on
// retries, which the recovery loop drains into its index.
type advancer struct {
	nc      *nats.Conn
	term    *term
	timeout time.Duration
	log     zerolog.Logger
	retries chan string
}

func newAdvancer(nc *nats.Conn, t *term, timeout time.Duration, log zerolog.Logger) *advancer {
	return &advancer{nc: nc, term: t, timeout: timeout, log: log, retries: make(chan string, 4096)}
}

// Advance sends one advance request for job and waits for the answer. It
// returns an error matching ErrAdvanceFailed when no scheduler did it, and
// errNotLeader (without asking) once this term has lost the lease.
func (a *advancer) Advance(ctx context.Context, job string) error {
	if err := a.term.fence(); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	reply, err := a.nc.RequestWithContext(rctx, protocol.SubjectControlAdvance, []byte(job))
	if err != nil {
		return fmt.Errorf("%w: job %s: %w", ErrAdvanceFailed, job, err)
	}
	if _, err := protocol.ParseReply(reply.Data); err != nil {
		return fmt.Errorf("%w: job %s: scheduler answered: %w", ErrAdvanceFailed, job, err)
	}
	return nil
}

// AdvanceOrRetry asks a scheduler to advance job; if none does, the
// recovery loop asks again after recovery_retry (and the job's pending
// records come due after the recovery grace in any case).
func (a *advancer) AdvanceOrRetry(ctx context.Context, job string) {
	err := a.Advance(ctx, job)
	if err == nil || errors.Is(err, errNotLeader) || ctx.Err() != nil {
		return
	}
	a.log.Warn().Err(err).Str(logging.FieldJob, job).Msg("advance request failed; the recovery loop asks again")
	select {
	case a.retries <- job:
	default:
		// The job's pending records come due in the index after the grace.
	}
}
