// Package procs builds Warden's binaries and runs them as real processes
// for end-to-end and chaos tests: a process boundary is what those tests
// exercise (kill -9, SIGSTOP, restarts), so nothing here runs in-process.
package procs
