//go:build unix && !linux

package dev

import "syscall"

// sysProcAttr puts a child in its own process group, away from the
// terminal's Ctrl-C.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
