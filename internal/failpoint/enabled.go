//go:build failpoints

package failpoint

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// Enabled reports whether this binary was built with failpoints.
const Enabled = true

var (
	once   sync.Once
	target string
	at     int64
	hits   atomic.Int64
)

func setup() {
	spec := os.Getenv(Env)
	if spec == "" {
		return
	}
	name, n, err := parse(spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cdcrelay:", err)
		os.Exit(2)
	}
	target, at = name, int64(n)
}

// Hit kills the process with SIGKILL if CDCRELAY_FAILPOINT names this
// failpoint and this is the time it counts.
func Hit(name string) {
	once.Do(setup)
	if name != target || hits.Add(1) != at {
		return
	}
	fmt.Fprintf(os.Stderr, "cdcrelay: failpoint %s hit (time %d): SIGKILL\n", name, at)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way; do not run past the failpoint
}
