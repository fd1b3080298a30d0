package dev

import "syscall"

// sysProcAttr puts a child in its own process group, away from the
// terminal's Ctrl-C, and asks the kernel to SIGTERM it if `warden dev` dies
// without stopping it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
