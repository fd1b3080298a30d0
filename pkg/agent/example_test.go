package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"sync/atomic"
	"time"

	"github.com/wardenhq/warden/internal/cluster"
	"github.com/wardenhq/warden/internal/sandbox"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/client"
	"github.com/wardenhq/warden/pkg/protocol"
)

// run submits spec to the sandbox and returns the finished job's steps.
func run(sys *sandbox.System, spec string) (client.JobDetail, error) {
	c, err := client.Connect(sys.URL, client.Options{})
	if err != nil {
		return client.JobDetail{}, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := c.Submit(ctx, []byte(spec), client.SubmitOptions{})
	if err != nil {
		return client.JobDetail{}, err
	}
	if _, err := c.Follow(ctx, r.JobID, nil); err != nil {
		return client.JobDetail{}, err
	}
	return c.Job(ctx, r.JobID)
}

// An agent with a custom action: the handler binds the step's params and
// returns its output, which the scheduler stores in the step record.
func Example_customAction() {
	sys, err := sandbox.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer sys.Close()

	_, err = sys.Agent(agent.Config{ID: "upper-1", Capabilities: []string{"text"}}, func(a *agent.Agent) {
		a.Handle("upper", func(ctx context.Context, t *agent.Task) (any, error) {
			var p struct {
				Text string `json:"text"`
			}
			if err := t.Bind(&p); err != nil {
				return nil, err // bad params: a permanent failure
			}
			return map[string]string{"text": strings.ToUpper(p.Text)}, nil
		})
	})
	if err != nil {
		log.Fatal(err)
	}

	job, err := run(sys, `
name: shout
steps:
  - {id: s1, action: upper, requires: [text], params: {text: hello}}
`)
	if err != nil {
		log.Fatal(err)
	}
	st := job.Steps[0]
	fmt.Println(st.State, string(st.Output))
	// Output: succeeded {"text":"HELLO"}
}

// A handler says by its error whether a failure is worth retrying:
// agent.Retriable (or RetryAfter) and the scheduler tries again after a
// backoff, agent.Permanent and the step fails at once.
func Example_retriableVsPermanent() {
	sys, err := sandbox.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer sys.Close()

	var calls atomic.Int32
	_, err = sys.Agent(agent.Config{ID: "a1"}, func(a *agent.Agent) {
		a.Handle("flaky", func(ctx context.Context, t *agent.Task) (any, error) {
			if calls.Add(1) == 1 {
				return nil, agent.Retriable(errors.New("backend busy"))
			}
			return "done", nil
		})
		a.Handle("strict", func(ctx context.Context, t *agent.Task) (any, error) {
			return nil, agent.Permanent(errors.New("input rejected"))
		})
	})
	if err != nil {
		log.Fatal(err)
	}

	for _, spec := range []string{
		"name: flaky\nsteps: [{id: s, action: flaky}]",
		"name: strict\nsteps: [{id: s, action: strict}]",
	} {
		job, err := run(sys, spec)
		if err != nil {
			log.Fatal(err)
		}
		st := job.Steps[0]
		fmt.Printf("%s: %s after %d attempt(s)\n", job.Job.Name, st.State, len(st.Attempts))
		if st.State == client.StepFailed {
			fmt.Println("  error:", st.LastError)
		}
	}
	// Output:
	// flaky: succeeded after 2 attempt(s)
	// strict: failed after 1 attempt(s)
	//   error: input rejected
}

// Agents of an active-passive cluster elect one leader; a handler (or
// anything else in the program) asks whether this agent leads. The cluster
// is defined here as `warden cluster create` would.
func Example_clusterLeader() {
	sys, err := sandbox.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer sys.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := cluster.Open(ctx, sys.JS)
	if err != nil {
		log.Fatal(err)
	}
	_, err = st.Create(ctx, protocol.ClusterDefinition{Name: "db", Mode: protocol.ModeActivePassive,
		TargetGroup: protocol.TargetGroup{Name: "primary", Targets: []string{"pg"}},
		Election:    protocol.ClusterElection{LeaseDuration: protocol.Duration(time.Second)}})
	if err != nil {
		log.Fatal(err)
	}
	var members []*agent.Agent
	for _, id := range []string{"db-1", "db-2"} {
		a, err := sys.Agent(agent.Config{ID: id, Cluster: "db"}, nil)
		if err != nil {
			log.Fatal(err)
		}
		members = append(members, a)
	}
	leaders := func() (n int) {
		for _, a := range members {
			if a.IsClusterLeader() {
				n++
			}
		}
		return n
	}
	for leaders() != 1 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond) // an election takes a lease round
	}
	for _, a := range members {
		if a.IsClusterLeader() {
			v, _ := a.Cluster()
			fmt.Println("one leader:", v.IsLeader, "role:", v.Role, "serves:", v.Targets)
		}
	}
	// Output: one leader: true role: leader serves: [pg]
}
