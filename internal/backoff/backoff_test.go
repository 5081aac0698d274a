package backoff

import (
	"testing"
	"time"
)

// TestBackoffSchedule: the wait doubles from lo to hi; jitter stays
// within [d/2, d].
func TestBackoffSchedule(t *testing.T) {
	var d time.Duration
	var got []time.Duration
	for range 8 {
		d = Next(d, 100*time.Millisecond, time.Second)
		got = append(got, d)
	}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000, 1000, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("schedule %v, want %v ms", got, want)
		}
	}
	for range 1000 {
		if w := Jitter(time.Second); w < 500*time.Millisecond || w > time.Second {
			t.Fatalf("jitter(1s) = %s", w)
		}
	}
}
