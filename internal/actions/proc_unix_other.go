//go:build unix && !linux

package actions

import "syscall"

// commandSysProcAttr starts a command in a process group of its own, which
// killGroup kills whole. There is no parent-death signal here: a command
// outlives an agent that dies without cancelling it.
func commandSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
