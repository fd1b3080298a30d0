package dev

import "syscall"

// sysProcAttr: Windows has no process groups in this sense; `warden dev`
// is meant for Unix-like systems.
func sysProcAttr() *syscall.SysProcAttr { return nil }
