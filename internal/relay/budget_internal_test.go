package relay

import (
	"context"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// TestMeteredBudget: what a session's budget holds is what was taken and
// not given back, by Acquire and TryAcquire alike; a refused TryAcquire
// takes nothing; the gauge follows the newest session's budget.
func TestMeteredBudget(t *testing.T) {
	r := &Relay{cfg: config.Config{MaxInFlightBytes: 100}}
	if got := r.inFlightBytes(); got != 0 {
		t.Fatalf("before a session: %v", got)
	}
	b := r.newBudget()
	if err := b.Acquire(context.Background(), 60); err != nil {
		t.Fatal(err)
	}
	if !b.TryAcquire(30) || b.TryAcquire(20) {
		t.Fatal("TryAcquire: want 30 taken, 20 more refused")
	}
	if got := r.inFlightBytes(); got != 90 {
		t.Fatalf("held %v, want 90", got)
	}
	b.Release(60)
	if got := r.inFlightBytes(); got != 30 {
		t.Fatalf("held %v after giving 60 back, want 30", got)
	}
	// A new session's budget replaces the failed one's, which still holds
	// its 30 (they die with it).
	next := r.newBudget()
	if got := r.inFlightBytes(); got != 0 {
		t.Fatalf("new session: %v, want 0", got)
	}
	if err := next.Acquire(context.Background(), 100); err != nil {
		t.Fatal(err)
	}
	if got := r.inFlightBytes(); got != 100 {
		t.Fatalf("new session full: %v", got)
	}
}
