package relay

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// pgstopSignaler is a Marker with a shutdown signal.
type pgstopSignaler struct {
	marksFakeMarker
	ch chan struct{}
}

func (p *pgstopSignaler) Stopping() <-chan struct{} { return p.ch }

// TestWatchStopping: the session ends with the retryable
// ErrDatabaseStopping once the marker signals a shutdown, and the watcher
// lets a session end normally otherwise (reader done, or ctx ended); a
// marker without the signal never ends a session.
func TestWatchStopping(t *testing.T) {
	if outcomesStopping(nil) != nil || outcomesStopping(&marksFakeMarker{}) != nil {
		t.Fatal("a marker without Stopping has a signal")
	}
	closed := func() chan struct{} { c := make(chan struct{}); close(c); return c }
	sig := &pgstopSignaler{ch: closed()}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name       string
		ctx        context.Context //nolint:containedctx // a table case's context
		stopping   <-chan struct{}
		readerDone <-chan struct{}
		want       error
	}{
		{"signalled", context.Background(), outcomesStopping(sig), nil, ErrDatabaseStopping},
		{"reader done", context.Background(), make(chan struct{}), closed(), nil},
		{"ctx ended", cancelled, nil, nil, nil},
	} {
		done := make(chan error, 1)
		go func() { done <- watchStopping(c.ctx, c.stopping, c.readerDone) }()
		select {
		case err := <-done:
			if !errors.Is(err, c.want) || (c.want == nil && err != nil) {
				t.Errorf("%s: %v, want %v", c.name, err, c.want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: watchStopping did not return", c.name)
		}
	}
	if IsFatal(fmt.Errorf("session: %w", ErrDatabaseStopping)) {
		t.Fatal("ErrDatabaseStopping ends the relay instead of a session")
	}
}
