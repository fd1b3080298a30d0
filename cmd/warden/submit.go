package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/spec"
)

type submitFlags struct {
	file        string
	wait        bool
	waitTimeout time.Duration
}

func (a *app) submitCommand() *cobra.Command {
	var f submitFlags
	cmd := &cobra.Command{
		Use:   "submit [-f FILE|-] [--wait]",
		Short: "Submit a job spec (YAML or JSON) from a file or stdin",
		Long: `Submit validates the job spec locally, publishes it to warden.submit and
prints the job id once the server has durably accepted it (PubAck) and the
scheduler has confirmed it. With --wait it follows the job live and exits 0
only if the job succeeded (1 if it failed or was cancelled).

A spec with an idempotency_key always names the same job: submitting it again
prints the existing job's id.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.submit(cmd.Context(), f) },
	}
	cmd.Flags().StringVarP(&f.file, "file", "f", "", "job spec file, or - for stdin (default stdin)")
	cmd.Flags().BoolVar(&f.wait, "wait", false, "follow the job to its end; exit 0 only if it succeeded")
	cmd.Flags().DurationVar(&f.waitTimeout, "wait-timeout", 0, "with --wait, give up after this long (exit 4); 0 waits until the job ends")
	return cmd
}

func (a *app) submit(ctx context.Context, f submitFlags) error {
	body, err := a.readSpec(f.file)
	if err != nil {
		return err
	}
	// Validate before connecting: an invalid spec is the caller's problem
	// (exit 2) whether or not a server is reachable. Submit checks again.
	sp, err := spec.Parse(body, spec.Limits{})
	if err != nil {
		return err
	}
	c, err := a.connect()
	if err != nil {
		return err
	}
	defer c.Close()

	pctx, stop := a.perm.bind(ctx)
	defer stop()
	// --timeout 0 (no bound elsewhere) leaves the reply wait at the
	// client's default, and this bound must outlast it.
	bound := a.timeout
	if bound <= 0 {
		bound = client.DefaultReplyTimeout
	}
	rctx, cancel := context.WithTimeout(pctx, bound+5*time.Second)
	defer cancel()
	receipt, err := c.Submit(rctx, body, client.SubmitOptions{})
	if err != nil {
		// The job may exist (the PubAck was lost) or does (Ctrl-C while
		// waiting for the scheduler): say which job it is.
		a.printUnsettled(receipt, err, sp.IdempotencyKey != "")
		return err
	}
	if !a.json {
		a.printReceipt(receipt)
	}
	if !f.wait {
		if a.json {
			return writeJSON(a.stdout, receipt)
		}
		return nil
	}

	job, err := a.watchJob(ctx, receipt.JobID, receipt.StartsAt, f.waitTimeout, func(ctx context.Context, update func(client.Update)) (*client.Job, error) {
		return c.FollowSubmission(ctx, receipt, update)
	})
	if err != nil {
		return err
	}
	if a.json {
		d, err := c.Job(ctx, job.ID)
		if err != nil {
			return err
		}
		if err := writeJSON(a.stdout, struct {
			Receipt client.Receipt `json:"receipt"`
			client.JobDetail
		}{receipt, d}); err != nil {
			return err
		}
	}
	if job.State != jobstore.JobSucceeded {
		return &exitError{code: exitJobFailed}
	}
	return nil
}

// watchJob prints a job's progress (newProgress) while follow follows it,
// until it ends or waitTimeout (0: none) passes, which is a
// *waitTimeoutError saying what the job was doing. In JSON mode stdout
// carries one document: the progress goes to stderr. submit --wait and
// job follow share it.
func (a *app) watchJob(ctx context.Context, id string, startsAt time.Time, waitTimeout time.Duration,
	follow func(context.Context, func(client.Update)) (*client.Job, error)) (*client.Job, error) {
	wctx := ctx
	if waitTimeout > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, waitTimeout)
		defer cancel()
	}
	out := a.stdout
	if a.json {
		out = a.stderr
	}
	p := newProgress(out)
	p.startsAt = startsAt
	job, err := follow(wctx, p.update)
	if err != nil && waitTimeout > 0 && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return nil, &waitTimeoutError{job: id, state: p.state(), after: waitTimeout, err: err}
	}
	return job, err
}

// waitTimeoutError is a --wait that --wait-timeout ended before the job
// did. It says what the job was doing then and how to follow it on; it
// unwraps to the deadline, a timeout (exit 4).
type waitTimeoutError struct {
	job   string
	state string
	after time.Duration
	err   error
}

func (e *waitTimeoutError) Error() string {
	return fmt.Sprintf("job %s is still %s after --wait-timeout %s; it goes on without this command: follow it with `warden job show %s`",
		e.job, e.state, e.after, e.job)
}

func (e *waitTimeoutError) Unwrap() error { return e.err }

func (a *app) printReceipt(r client.Receipt) {
	switch {
	case r.Existing:
		fmt.Fprintf(a.stdout, "job %s (%s) already exists: this spec's idempotency key was submitted before\n", r.JobID, r.Name)
	case r.Confirmed:
		fmt.Fprintf(a.stdout, "job %s (%s) accepted\n", r.JobID, r.Name)
	default:
		fmt.Fprintf(a.stdout, "job %s (%s) accepted\n", r.JobID, r.Name)
		fmt.Fprintf(a.stderr, "warning: no scheduler confirmed job %s within %s; it is stored in %s and will run when a scheduler is up\n",
			r.JobID, a.timeout, r.Stream)
	}
}

// printUnsettled tells which job a submission that ended in err is: one
// the server may have stored (its PubAck lost), or one it stored whose
// scheduler's confirmation was not waited for (an interrupt). A rejection
// names its job in the error.
func (a *app) printUnsettled(r client.Receipt, err error, keyed bool) {
	unknown := errors.Is(err, client.ErrOutcomeUnknown)
	if errors.Is(err, client.ErrRejected) || (!unknown && r.Sequence == 0) {
		return
	}
	if a.json {
		_ = writeJSON(a.stdout, r) // the job id for scripts; the error goes to stderr
	}
	if !unknown {
		if !a.json {
			fmt.Fprintf(a.stdout, "job %s (%s) accepted\n", r.JobID, r.Name)
		}
		fmt.Fprintf(a.stderr, "warning: job %s is stored in %s and will run; the wait for a scheduler's confirmation was cut short\n", r.JobID, r.Stream)
		return
	}
	fmt.Fprintf(a.stderr, "job %s (%s) may have been stored: the server did not confirm the submission.\n", r.JobID, r.Name)
	if keyed {
		fmt.Fprintf(a.stderr, "Submitting the spec again is safe (its idempotency_key names job %s), or check with `warden job show %s`.\n", r.JobID, r.JobID)
		return
	}
	fmt.Fprintf(a.stderr, "Check with `warden job show %s` before submitting again (exit 3, not found: it was not stored, or was rejected):\n"+
		"the spec has no idempotency_key, so submitting it again makes a second job if this one was stored.\n", r.JobID)
}

// readSpec reads the spec from a file, or stdin for "-" or no file.
func (a *app) readSpec(file string) ([]byte, error) {
	if file != "" && file != "-" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, usageError("read job spec: %v", err)
		}
		return b, nil
	}
	if f, ok := a.stdin.(*os.File); ok && file == "" && isatty.IsTerminal(f.Fd()) {
		return nil, usageError("no job spec: pass -f FILE, or pipe the spec to stdin")
	}
	b, err := io.ReadAll(a.stdin)
	if err != nil {
		return nil, usageError("read job spec from stdin: %v", err)
	}
	return b, nil
}
