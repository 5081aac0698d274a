//go:build !linux

package main

import "syscall"

// relaySysProcAttr puts the relay in its own process group, so a Ctrl-C at
// the terminal reaches only the demo, which then stops the relay in order.
func relaySysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
