//go:build !unix

package actions

import (
	"os"
	"syscall"
)

// commandSysProcAttr: no process groups here; killGroup kills the command
// alone, and what it started lives on.
func commandSysProcAttr() *syscall.SysProcAttr { return nil }

func killGroup(p *os.Process) error { return p.Kill() }
