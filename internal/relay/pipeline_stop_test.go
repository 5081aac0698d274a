package relay

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestStopperPhases: the hard stop comes timeout after the soft stop, at
// once when the session is lost (abort), also while a soft stop's drain
// runs, and never after close; onHard runs exactly when the hard stop
// comes before close.
func TestStopperPhases(t *testing.T) {
	const timeout = 10 * time.Second
	tests := []struct {
		name       string
		softAt     time.Duration // <0: never
		abortAt    time.Duration // <0: never
		closeAt    time.Duration
		wantHardAt time.Duration // <0: not before close
	}{
		{"soft stop drains for the timeout", 1 * time.Second, -1, time.Minute, 11 * time.Second},
		{"lock lost while streaming", -1, 2 * time.Second, time.Minute, 2 * time.Second},
		{"lock lost during the drain", 1 * time.Second, 3 * time.Second, time.Minute, 3 * time.Second},
		{"lock lost after the drain's deadline", 1 * time.Second, 20 * time.Second, time.Minute, 11 * time.Second},
		{"drained before the deadline", 1 * time.Second, -1, 5 * time.Second, -1},
		{"returned without a stop", -1, -1, 5 * time.Second, -1},
		{"lock lost after return", -1, 6 * time.Second, 5 * time.Second, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				soft, stopSoft := context.WithCancel(context.Background())
				defer stopSoft()
				abort, lose := context.WithCancel(context.Background())
				defer lose()
				var onHard atomic.Int32
				began := time.Now()
				s := newStopper(soft, abort, timeout, func() { onHard.Add(1) })
				at := func(d time.Duration, f func()) {
					if d >= 0 {
						time.AfterFunc(d, f)
					}
				}
				at(tt.softAt, stopSoft)
				at(tt.abortAt, lose)
				hardAt := time.Duration(-1)
				closed := make(chan struct{})
				go func() {
					select {
					case <-s.hard.Done():
						hardAt = time.Since(began)
					case <-closed:
					}
				}()
				time.Sleep(tt.closeAt)
				close(closed)
				synctest.Wait()
				s.close()
				// Whatever is still to come (a late abort) finds the
				// stopper closed.
				time.Sleep(time.Minute)
				synctest.Wait()
				if hardAt != tt.wantHardAt {
					t.Errorf("hard stop at %v, want %v (-1: none before close)", hardAt, tt.wantHardAt)
				}
				want := int32(0)
				if tt.wantHardAt >= 0 {
					want = 1
				}
				if got := onHard.Load(); got != want {
					t.Errorf("onHard ran %d times, want %d", got, want)
				}
				if s.stopped() != (tt.softAt >= 0 && tt.softAt < tt.closeAt) {
					t.Errorf("stopped() = %v with the soft stop at %v", s.stopped(), tt.softAt)
				}
			})
		})
	}
}
