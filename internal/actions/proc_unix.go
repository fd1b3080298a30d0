//go:build unix

package actions

import (
	"errors"
	"os"
	"syscall"
)

// killGroup kills p's process group (see commandSysProcAttr): the command
// and every process it started that stayed in its group, so that none
// lives on after a step's timeout, deadline, cancel or lost lease and runs
// beside its retry. Killing p alone left make's or a script's children
// running, re-parented to init.
func killGroup(p *os.Process) error {
	err := syscall.Kill(-p.Pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}
