//go:build !linux

package main

import "syscall"

// relaySysProcAttr puts the relay in its own process group, so a Ctrl-C at
// the terminal reaches only the bench, which then stops the relay in order.
// (The bench reads /proc and measures only on Linux.)
func relaySysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
