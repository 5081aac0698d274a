// Package leak fails a test binary that leaves goroutines running: the
// pure packages' TestMain calls leak.Main, which snapshots the goroutines
// before the tests, runs them, then waits a few seconds for any extra
// goroutine to exit and reports the stacks of those that do not. It is a
// small stand-in for goleak.VerifyTestMain, with no module dependency;
// docs/testing.md, "Goroutine leaks".
package leak

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// grace is how long extra goroutines get to exit after the last test:
// stopped goroutines (timers, closed pipes) need a moment to unwind.
const grace = 5 * time.Second

// Main runs m's tests and exits with their code, or with 1 if they passed
// but goroutines started during them are still running.
func Main(m *testing.M) {
	before := ids(stacks())
	code := m.Run()
	if code == 0 {
		if extra := Wait(before, grace); len(extra) > 0 {
			fmt.Fprintf(os.Stderr, "leak: %d goroutine(s) still running after the tests:\n\n%s\n", len(extra), strings.Join(extra, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

// Wait polls until every goroutine not in before has exited or within has
// passed, and returns the stacks of those still running.
func Wait(before map[string]bool, within time.Duration) []string {
	deadline := time.Now().Add(within)
	for {
		extra := Extra(before)
		if len(extra) == 0 || time.Now().After(deadline) {
			return extra
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Snapshot returns the ids of the goroutines running now.
func Snapshot() map[string]bool { return ids(stacks()) }

// Extra returns the stacks of running goroutines not in before, leaving
// out the runtime's and the testing package's own.
func Extra(before map[string]bool) []string {
	var out []string
	for _, g := range stacks() {
		if before[id(g)] || ignored(g) {
			continue
		}
		out = append(out, g)
	}
	return out
}

// stacks returns one stack trace per goroutine, the caller's included.
func stacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(strings.TrimSpace(string(buf[:n])), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// id is a goroutine's header number: "goroutine 7 [running]:" gives "7".
func id(stack string) string {
	header, _, _ := strings.Cut(stack, "\n")
	fields := strings.Fields(header)
	if len(fields) < 2 {
		return header
	}
	return fields[1]
}

func ids(all []string) map[string]bool {
	out := make(map[string]bool, len(all))
	for _, g := range all {
		out[id(g)] = true
	}
	return out
}

// ignoredFrames mark goroutines that belong to the runtime or the test
// framework, not to the code under test.
var ignoredFrames = []string{
	"testing.(*M).",
	"testing.tRunner",
	"testing.runTests",
	"testing.(*T).Run",
	"runtime.goexit",
	"os/signal.signal_recv",
	"os/signal.loop",
	"runtime.ensureSigM",
}

// ignored reports whether the goroutine is the caller itself or a runtime
// or testing goroutine (by its top function).
func ignored(stack string) bool {
	lines := strings.Split(stack, "\n")
	if len(lines) < 2 {
		return true
	}
	if strings.Contains(lines[0], "[running]") && strings.Contains(stack, "leak.stacks") {
		return true
	}
	top := lines[1]
	return slices.ContainsFunc(ignoredFrames, func(f string) bool { return strings.HasPrefix(top, f) })
}
