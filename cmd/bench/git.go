package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// revision is the source tree the bench runs from: `go run` stamps no VCS
// information into the binary, so the bench asks git when it starts.
type revision struct {
	commit string // git rev-parse HEAD
	dirty  bool   // git status --porcelain printed anything
	ok     bool   // both commands ran
}

// gitRevision reads HEAD and whether the work tree has uncommitted
// changes. It fails soft: without git, or outside a repository, it says
// so on stderr and returns a revision that is not ok. The status runs
// with --no-optional-locks, so it never rewrites the index of a tree
// others are working in.
func gitRevision(ctx context.Context) revision {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	head, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: no git revision recorded:", err)
		return revision{}
	}
	status, err := exec.CommandContext(ctx, "git", "--no-optional-locks", "status", "--porcelain").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: no git status recorded:", err)
		return revision{commit: strings.TrimSpace(string(head))}
	}
	return revision{commit: strings.TrimSpace(string(head)), dirty: len(strings.TrimSpace(string(status))) > 0, ok: true}
}
