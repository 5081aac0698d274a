package svckit

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Children lists the processes whose parent is pid (Linux /proc).
func Children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, ok := procStat(n); ok && ppid == pid {
			out = append(out, n)
		}
	}
	return out
}

// procStat reads a process's parent and state from /proc/<pid>/stat.
func procStat(pid int) (ppid int, state string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", false
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, "", false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, "", false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0], err == nil
}

// Alive reports whether pid still runs; a zombie (dead, not yet reaped by
// whoever adopted it) does not.
func Alive(pid int) bool {
	if _, state, ok := procStat(pid); ok {
		return state != "Z" && state != "X"
	}
	return syscall.Kill(pid, 0) == nil
}
