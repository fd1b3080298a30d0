// Command bench runs Warden's benchmark suite (`make bench`): raw JetStream
// baseline, Warden throughput, latency, large jobs, delayed jobs, concurrency keys, history,
// failover, cluster failover, scale and memory, in one
// run, and writes bench/results/<timestamp>.json and latest.json.
//
//	bench [--quick] [--only raw,throughput,latency,dag,delayed,concurrency,history,failover,cluster,scale,memory]
//	bench agent --server URL --id ID ...   (a real agent, used by failover)
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if len(os.Args) > 1 && os.Args[1] == "agent" {
		err = runAgent(ctx, os.Args[2:])
	} else {
		// The first interrupt lets the phase running stop its processes
		// and remove its store (a terminal's Ctrl-C has already reached
		// the children); a second one ends the bench at once.
		stopAfter := context.AfterFunc(ctx, func() {
			stop()
			fmt.Fprintln(os.Stderr, "bench: interrupted: the phase running finishes and cleans up, then the bench stops; interrupt again to quit now")
		})
		defer stopAfter()
		err = run(ctx, os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
