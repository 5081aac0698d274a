package toolkit

import "syscall"

// SysProcAttr puts the relay in its own process group, so a Ctrl-C at the
// terminal reaches only the tool, which then stops the relay in order (the
// demo before removing the database the relay streams from). Pdeathsig makes
// sure the relay does not outlive a tool that is killed outright.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
