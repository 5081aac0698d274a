package relay_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv/leak"
)

// TestMain fails the run if a test leaves a goroutine behind (as
// leak.Main does; docs/testing.md, "Goroutine leaks"), and removes the
// relay binary the process tests built, if any.
func TestMain(m *testing.M) {
	before := leak.Snapshot()
	code := m.Run()
	builds.Remove()
	if code == 0 {
		if extra := leak.Wait(before, leakGrace); len(extra) > 0 {
			fmt.Fprintf(os.Stderr, "leak: %d goroutine(s) still running after the tests:\n\n%s\n", len(extra), strings.Join(extra, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

// leakGrace is how long goroutines get to exit after the last test: a
// stopped relay's connections and timers need a moment to unwind.
const leakGrace = 5 * time.Second

// Parallel tests: the tests that run longest and spend most of that
// waiting (an idle window, SIGKILLs and takeovers, child processes, a
// blocked broker, a stopped or renamed database, backoff schedules) call
// t.Parallel, so that `make test` (-parallel 4) overlaps their waits
// instead of adding them up; each says so where it starts. Each has its
// own PostgreSQL cluster, exchange, queues and (where it needs one)
// private broker node; their assertions are about their own cluster and
// processes, with bounds that allow for a shared CPU. The tests that
// measure memory or latency figures stay sequential, as do the short ones.
//
// The fault suite: the longest waiting tests (a 60 s idle window, a broker
// blocking a full socket, marks refused until the status turns degraded)
// live in files tagged faults, and make test-faults runs them (the
// Makefile's RELAY_FAULT_TESTS), so that make test stays under 10 minutes
// on two cores.
