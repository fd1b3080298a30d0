package actions

import "syscall"

// commandSysProcAttr starts a command in a process group of its own, which
// killGroup kills whole, and has the kernel SIGKILL the command if the
// agent dies first (strictly: if the agent's thread that started it ends,
// which Go does only to a thread locked by a goroutine that exits locked).
// The death signal reaches the command only, not what it started: those
// outlive an agent killed with SIGKILL.
func commandSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
