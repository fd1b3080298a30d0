// Package chaos runs Warden as real processes — a nats-server with file
// storage, two schedulers, two supervisors and four ledger agents — submits
// jobs of mixed shapes, and kills, pauses and restarts everything while they
// run. Then it checks that nothing was fumbled.
//
// `go test ./test/chaos` runs a short form with a fixed seed; `make chaos`
// runs the full form (-chaos.full) with fresh seeds. Every run prints its
// seed; -chaos.seed=N replays the same jobs and fault schedule.
package chaos

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/wardenhq/warden/test/procs"
)

var (
	fullFlag = flag.Bool("chaos.full", false, "run the full suite: 240 jobs and a longer fault schedule")
	seedFlag = flag.Int64("chaos.seed", 0, "seed of the jobs and the fault schedule (0: 1 in the short form, time-based in the full form)")
)

var bins map[string]string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "warden-chaos-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins, err = procs.Build(dir, "scheduler", "supervisor", "./test/testagent", "github.com/nats-io/nats-server/v2")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
