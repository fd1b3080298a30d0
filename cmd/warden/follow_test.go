package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wardenhq/warden/internal/jobstore"
	"github.com/wardenhq/warden/internal/natstest"
)

// lockedBuffer is a bytes.Buffer a test reads while the CLI writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// There was no `warden job follow`: a job submitted elsewhere (a schedule,
// the API) could be watched only by running job show again. It prints the
// job's steps as they are, then each change as it happens, until the job
// ends, with submit --wait's exit codes.
func TestJobFollow(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		state jobstore.JobState
		code  int
	}{{jobstore.JobSucceeded, exitOK}, {jobstore.JobFailed, exitJobFailed}} {
		t.Run(string(c.state), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			id := "job-follow-" + string(c.state)
			finish := materialise(t, e, id, strings.Replace(keyed, "%s", id, 1))

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var stdout, stderr lockedBuffer
			done := make(chan int, 1)
			go func() {
				done <- run(ctx, []string{"job", "follow", id, "--server", e.url}, strings.NewReader(""), &stdout, &stderr)
			}()
			// The steps as they were when the follow started...
			natstest.Eventually(t, 10*time.Second, "the initial steps printed", func() bool {
				return strings.Contains(stdout.String(), "step b") && strings.Contains(stdout.String(), "job  "+id+" pending")
			})
			if strings.Contains(stdout.String(), "agent-1") {
				t.Fatalf("printed a dispatch before it happened:\n%s", stdout.String())
			}
			// ... then what happens to them, as it happens.
			finish(c.state)
			var code int
			select {
			case code = <-done:
			case <-ctx.Done():
				t.Fatalf("job follow did not end with the job:\n%s", stdout.String())
			}
			out := stdout.String()
			if code != c.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, c.code, out, stderr.String())
			}
			stepEnd := map[bool]jobstore.StepState{true: jobstore.StepSucceeded, false: jobstore.StepFailed}[c.state == jobstore.JobSucceeded]
			// Each record's last value is printed; a value overwritten
			// before the watch delivered it (the jobs bucket keeps one
			// per key) may not be, so "dispatched" is not looked for.
			for _, want := range []string{`step a +` + string(stepEnd) + ` +attempt 1  agent agent-1  epoch 1`, `step b +` + string(stepEnd),
				`job  ` + id + ` ` + string(c.state) + ` in `} {
				if !regexp.MustCompile(want).MatchString(out) {
					t.Errorf("stdout lacks %q:\n%s", want, out)
				}
			}

			// An ended job: its steps, at once, and the same exit code;
			// --json puts the job on stdout and the lines on stderr.
			r := warden(t, "", "job", "follow", id, "--json", "--server", e.url)
			var d struct {
				Job struct {
					ID    string `json:"id"`
					State string `json:"state"`
				} `json:"job"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || r.code != c.code || d.Job.ID != id || d.Job.State != string(c.state) || !strings.Contains(r.stderr, "step b") {
				t.Fatalf("follow --json of the ended job: exit %d (%v)\nstdout:\n%s\nstderr:\n%s", r.code, err, r.stdout, r.stderr)
			}
		})
	}
}

func TestJobFollowUnknownExit3(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := warden(t, "", "job", "follow", "job-nope", "--server", e.url)
	if r.code != exitNotFound || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("exit %d, stderr %q; want 3 at once, not a wait for the job", r.code, r.stderr)
	}
}

// --wait-timeout ends the follow of a job still running with exit 4 and
// says how the job stood.
func TestJobFollowWaitTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t)
	materialise(t, e, "job-slow", strings.Replace(keyed, "%s", "slow", 1))
	r := warden(t, "", "job", "follow", "job-slow", "--wait-timeout", "200ms", "--server", e.url)
	if r.code != exitUnavailable || !strings.Contains(r.stderr, "job job-slow is still pending after --wait-timeout 200ms") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}
