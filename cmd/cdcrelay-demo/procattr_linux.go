package main

import "syscall"

// relaySysProcAttr puts the relay in its own process group, so a Ctrl-C at
// the terminal reaches only the demo, which then stops the relay in order
// (before removing the database it streams from). Pdeathsig makes sure the
// relay does not outlive a demo that is killed outright.
func relaySysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
