//go:build !linux

package toolkit

import "syscall"

// SysProcAttr puts the relay in its own process group, so a Ctrl-C at the
// terminal reaches only the tool, which then stops the relay in order.
// (Pdeathsig is Linux only; the bench also reads /proc and measures only on
// Linux.)
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
