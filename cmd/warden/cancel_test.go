package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
	"github.com/wardenhq/warden/pkg/protocol"
	"github.com/wardenhq/warden/streams"
)

// cancelWait is a server, a job in it, and `warden job cancel` of that
// job running in the background.
type cancelWait struct {
	srv  *natstest.Server
	e    env
	id   string
	done chan result
}

// startCancel stores job id (one pending step; no scheduler runs, so the
// job ends when the test says) and runs `warden job cancel` on it with
// args; it returns once the cancel is recorded and the CLI is waiting for
// the job to end.
func startCancel(t *testing.T, id string, args ...string) *cancelWait {
	t.Helper()
	srv, _, js := natstest.Start(t, streams.Options{TaskShards: 1})
	st, err := jobstore.Open(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	c := &cancelWait{srv: srv, e: env{url: srv.URL, js: js, store: st}, id: id, done: make(chan result, 1)}
	materialise(t, c.e, id, "name: w\nsteps:\n- {id: a, action: echo}\n")
	go func() {
		c.done <- warden(t, "", append([]string{"job", "cancel", id, "--server", srv.URL}, args...)...)
	}()
	natstest.Eventually(t, 10*time.Second, "the cancel recorded", func() bool {
		j, _, err := st.Job(context.Background(), id)
		return err == nil && j.Desired == jobstore.JobCancelled
	})
	c.waitForReads(t, 2) // the CLI reads the job: it waits for its end
	return c
}

// cliRequests is how many messages the CLI's connection has published.
func (c *cancelWait) cliRequests(t *testing.T) int64 {
	t.Helper()
	cz, err := c.srv.Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ci := range cz.Conns {
		if ci.Name == "warden-cli" {
			return ci.InMsgs
		}
	}
	return -1 // gone: the CLI exited
}

// waitForReads waits until the CLI has made n more requests, or exited.
func (c *cancelWait) waitForReads(t *testing.T, n int64) {
	t.Helper()
	from := c.cliRequests(t)
	natstest.Eventually(t, 20*time.Second, "the CLI reads the job again", func() bool {
		got := c.cliRequests(t)
		return got < 0 || got >= from+n
	})
}

// reads makes the job store's reads fail (false), as they do while the
// bucket's stream has no leader or the server is out of reach: its direct
// gets have no responder; true serves them again.
func (c *cancelWait) reads(t *testing.T, on bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.e.js.Stream(ctx, "KV_"+protocol.BucketJobs)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.AllowDirect = on
	if _, err := c.e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, "job store reads follow the stream's allow_direct", func() bool {
		_, _, err := c.e.store.Job(ctx, c.id)
		return (err == nil) == on
	})
}

// end ends the job cancelled, as its scheduler would.
func (c *cancelWait) end(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	j, rev, err := c.e.store.Job(ctx, c.id)
	if err != nil {
		t.Fatal(err)
	}
	j.State, j.FinishedAt = jobstore.JobCancelled, time.Now().UTC()
	if _, err := c.e.store.UpdateJob(ctx, j, rev); err != nil {
		t.Fatal(err)
	}
}

func (c *cancelWait) result(t *testing.T) result {
	t.Helper()
	select {
	case r := <-c.done:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("warden job cancel did not return")
		return result{}
	}
}

// `warden job cancel` waited for the job's end and failed at the first
// read that did not answer: exit 4 and no report, after the cancel had
// taken effect durably (a script cancelling again then got "conflict").
// Reads that fail for less than --timeout are tried again now, and the
// command reports the job's end as usual.
func TestCancelWaitOutlastsFailedReads(t *testing.T) {
	t.Parallel()
	c := startCancel(t, "job-wait")
	c.reads(t, false)
	c.waitForReads(t, 3) // each read fails now: at least two did
	c.reads(t, true)
	c.end(t)
	r := c.result(t)
	if r.code != exitOK || !strings.Contains(r.stdout, "job job-wait cancelled: 1 pending step cancelled, 0 running steps interrupted; job cancelled in ") {
		t.Fatalf("cancel with reads failing a moment: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// Reads that keep failing end the wait after --timeout; the command then
// says that the cancel is recorded and holds, with its report (JSON:
// "cancel_recorded"), and exits 4, rather than fail as if it had not
// cancelled.
func TestCancelWaitThatGivesUpSaysTheCancelHolds(t *testing.T) {
	t.Parallel()
	c := startCancel(t, "job-giveup", "--json", "--timeout", "2s")
	c.reads(t, false)
	r := c.result(t)
	c.reads(t, true)
	var out struct {
		Report struct {
			JobID     string   `json:"job_id"`
			Cancelled []string `json:"cancelled"`
		} `json:"report"`
		Recorded  bool              `json:"cancel_recorded"`
		WaitError string            `json:"wait_error"`
		State     jobstore.JobState `json:"state"`
		Took      *string           `json:"took"` // never set: the job did not end
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || !out.Recorded || out.Report.JobID != "job-giveup" ||
		len(out.Report.Cancelled) != 1 || out.WaitError == "" || out.State.Terminal() || out.Took != nil {
		t.Fatalf("stdout %q (%v)", r.stdout, err)
	}
	var e struct {
		Error    string `json:"error"`
		Code     string `json:"code"`
		ExitCode int    `json:"exit_code"`
	}
	if err := json.Unmarshal([]byte(r.stderr), &e); err != nil || r.code != exitUnavailable || e.ExitCode != exitUnavailable ||
		!strings.Contains(e.Error, "the cancel is recorded and holds") || !strings.Contains(e.Error, "reads failed for") {
		t.Fatalf("exit %d, stderr %q (%v)", r.code, r.stderr, err)
	}
	t.Logf("gave up: exit %d, %s", r.code, e.Error)
}
