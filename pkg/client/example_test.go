package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/wardenhq/warden/internal/sandbox"
	"github.com/wardenhq/warden/pkg/agent"
	"github.com/wardenhq/warden/pkg/client"
)

// Submit a job and wait for it to finish. The sandbox stands in for a
// deployment (NATS, a scheduler, a supervisor); an agent with the built-in
// echo action serves the default pool.
func Example() {
	sys, err := sandbox.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer sys.Close()
	if _, err := sys.Agent(agent.Config{ID: "worker-1"}, nil); err != nil {
		log.Fatal(err)
	}

	c, err := client.Connect(sys.URL, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	receipt, err := c.Submit(ctx, []byte(`
name: hello
steps:
  - {id: greet, action: echo, params: {message: hi}}
  - {id: wave, action: echo, depends_on: [greet]}
`), client.SubmitOptions{})
	if err != nil {
		log.Fatal(err) // invalid spec, rejected, or not accepted by the server
	}
	job, err := c.Follow(ctx, receipt.JobID, nil) // returns once the job is terminal
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(job.Name, job.State)
	detail, err := c.Job(ctx, receipt.JobID)
	if err != nil {
		log.Fatal(err)
	}
	for _, st := range detail.Steps {
		fmt.Println(st.ID, st.State, st.Actor)
	}
	// Output:
	// hello succeeded
	// greet succeeded worker-1
	// wave succeeded worker-1
}

// Cancel a running job: the desired state becomes cancelled and wins; the
// running step's handler sees its context end with agent.ErrCancelled, and
// the job ends cancelled.
func ExampleClient_Cancel() {
	sys, err := sandbox.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer sys.Close()
	started, stopped := make(chan struct{}), make(chan error, 1)
	_, err = sys.Agent(agent.Config{ID: "worker-1"}, func(a *agent.Agent) {
		a.Handle("wait", func(ctx context.Context, t *agent.Task) (any, error) {
			close(started)
			<-ctx.Done()
			stopped <- context.Cause(ctx)
			return nil, ctx.Err()
		})
	})
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.Connect(sys.URL, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	receipt, err := c.Submit(ctx, []byte("name: long\nsteps: [{id: s1, action: wait}, {id: s2, action: echo, depends_on: [s1]}]"), client.SubmitOptions{})
	if err != nil {
		log.Fatal(err)
	}
	<-started
	report, err := c.Cancel(ctx, receipt.JobID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("cancelled:", report.Cancelled, "interrupted:", report.Interrupted)
	job, err := c.Follow(ctx, receipt.JobID, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(job.State)
	fmt.Println("handler stopped by the cancel:", errors.Is(<-stopped, agent.ErrCancelled))
	// Output:
	// cancelled: [s2] interrupted: [s1]
	// cancelled
	// handler stopped by the cancel: true
}

// A delayed job: the server holds the submission (a JetStream message
// schedule) until its time, so no Warden process keeps a timer and a
// restart loses nothing.
func ExampleClient_Submit_delayed() {
	sys, err := sandbox.Start()
	if err != nil {
		log.Fatal(err)
	}
	defer sys.Close()
	if _, err := sys.Agent(agent.Config{ID: "worker-1"}, nil); err != nil {
		log.Fatal(err)
	}
	c, err := client.Connect(sys.URL, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	receipt, err := c.Submit(ctx, []byte("name: later\ndelay: 1s\nsteps: [{id: s1, action: echo}]"), client.SubmitOptions{})
	if err != nil {
		log.Fatal(err)
	}
	job, err := c.Follow(ctx, receipt.JobID, nil)
	if err != nil {
		log.Fatal(err)
	}
	detail, err := c.Job(ctx, receipt.JobID)
	if err != nil {
		log.Fatal(err)
	}
	started := detail.Steps[0].Attempts[0].StartedAt
	fmt.Println("delayed:", !receipt.StartsAt.IsZero())
	fmt.Println(job.State, "no earlier than its time:", !started.Before(receipt.StartsAt))
	// Output:
	// delayed: true
	// succeeded no earlier than its time: true
}
