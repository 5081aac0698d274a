package leak

import (
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) { Main(m) }

// TestExtraReportsARunningGoroutine checks that a goroutine started after
// the snapshot is reported while it runs, with its stack, and no longer
// once it has exited.
func TestExtraReportsARunningGoroutine(t *testing.T) {
	before := Snapshot()
	stop := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		parkedForLeakTest(stop)
	}()
	extra := Wait(before, 50*time.Millisecond)
	if len(extra) != 1 || !strings.Contains(extra[0], "parkedForLeakTest") {
		t.Fatalf("extra goroutines while one is parked: %q", extra)
	}
	close(stop)
	<-exited
	if extra := Wait(before, 2*time.Second); len(extra) != 0 {
		t.Fatalf("extra goroutines after it exited: %q", extra)
	}
}

//go:noinline
func parkedForLeakTest(stop <-chan struct{}) { <-stop }
