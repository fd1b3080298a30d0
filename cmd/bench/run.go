package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/wardenhq/warden/internal/bench"
)

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "shorter phases, smaller fleets (a smoke run, about 2 minutes)")
	only := fs.String("only", "", "comma-separated phases to run: "+strings.Join(bench.Phases, ","))
	server := fs.String("server", "binary", "binary: a nats-server process per phase; embedded: in this process")
	natsServer := fs.String("nats-server", "", "nats-server binary (default: build the go.mod version)")
	out := fs.String("out", "bench/results", "results directory")
	noWrite := fs.Bool("no-write", false, "print only; write no result files")
	agents := fs.String("agents", "", "scale phase fleet sizes (default 100,1000,5000; quick 100,1000)")
	rssSteps := fs.Int("rss-steps", 0, "queued steps in the memory phase (default 1000000; quick 100000)")
	foTrials := fs.Int("failover-trials", 0, "agents killed holding a step (default 24; quick 8)")
	toTrials := fs.Int("takeover-trials", 0, "supervisor leader kills (default 3; quick 1)")
	dagSteps := fs.Int("dag-steps", 0, "steps of the large jobs in the dag phase (default 1000)")
	chainSteps := fs.Int("chain-steps", 0, "length of the chain in the dag phase (default 100)")
	historyJobs := fs.Int("history-jobs", 0, "finished jobs the history phase leaves behind (default 20000)")
	beforeFile := fs.String("before", "", "a previous run's JSON (e.g. bench/results/latest.json): the Markdown table gets a before column")
	profileDir := fs.String("profile-dir", "", "write CPU profiles of nats-server, the scheduler and this process over the throughput, half-load, job-shaped pipeline and scale windows here")
	cpuprofile := fs.String("cpuprofile", "", "write this process's CPU profile (the in-process supervisor, SDK agents and tracker; --profile-dir also profiles the scheduler binary)")
	memprofile := fs.String("memprofile", "", "write this process's allocation profile (every allocation sampled since start) when the run ends")
	workdir := fs.String("workdir", "", "keep binaries and stores here (default: a temp dir, removed)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var before map[string]any
	if *beforeFile != "" {
		b, err := os.ReadFile(*beforeFile)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, &before); err != nil {
			return fmt.Errorf("--before %s: %w", *beforeFile, err)
		}
	}
	cfg := bench.Config{Quick: *quick, Server: *server, NATSServer: *natsServer, WorkDir: *workdir,
		RSSSteps: *rssSteps, FailoverTrials: *foTrials, TakeoverTrials: *toTrials,
		DAGSteps: *dagSteps, ChainSteps: *chainSteps, HistoryJobs: *historyJobs, ProfileDir: *profileDir, Log: os.Stderr}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	if *agents != "" {
		for _, s := range strings.Split(*agents, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 {
				return fmt.Errorf("--agents: %q is not a positive number", s)
			}
			cfg.ScaleAgents = append(cfg.ScaleAgents, n)
		}
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *memprofile != "" {
		defer writeAllocProfile(*memprofile)
	}
	started := time.Now()
	rev := gitRevision(ctx)
	rep, err := bench.Run(ctx, cfg)
	interrupted := errors.Is(err, bench.ErrInterrupted)
	if err != nil && !interrupted {
		return err
	}
	// Provenance, read before the first phase: the results name the
	// commit they measured and whether the tree had uncommitted changes.
	if rev.commit != "" {
		rep.Set("git_revision", rev.commit)
	}
	if rev.ok {
		rep.Set("git_dirty", rev.dirty)
	}
	fmt.Println()
	rep.Print(os.Stdout)
	if interrupted {
		// A partial run is printed, never written: latest.json is what
		// the next run compares against.
		return err
	}
	if !*noWrite {
		paths, err := rep.WriteFiles(*out, started, before)
		if err != nil {
			return err
		}
		fmt.Println("\nwrote", strings.Join(paths, ", "))
	}
	return nil
}

// writeAllocProfile writes the allocation profile: run with --only to see
// one phase's allocations.
func writeAllocProfile(path string) {
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "memprofile:", err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		fmt.Fprintln(os.Stderr, "memprofile:", err)
	}
}
