package relay

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestWatchStopping: the session ends with the retryable
// ErrDatabaseShuttingDown once the janitor signals a shutdown, and the watcher
// lets a session end normally otherwise (reader done, or ctx ended).
func TestWatchStopping(t *testing.T) {
	closed := func() chan struct{} { c := make(chan struct{}); close(c); return c }
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name           string
		ctx            context.Context //nolint:containedctx // a table case's context
		dbShuttingDown <-chan struct{}
		readerDone     <-chan struct{}
		want           error
	}{
		{"signalled", context.Background(), closed(), nil, ErrDatabaseShuttingDown},
		{"reader done", context.Background(), make(chan struct{}), closed(), nil},
		{"ctx ended", cancelled, nil, nil, nil},
	} {
		done := make(chan error, 1)
		go func() { done <- watchDatabaseShutdown(c.ctx, c.dbShuttingDown, c.readerDone) }()
		select {
		case err := <-done:
			if !errors.Is(err, c.want) || (c.want == nil && err != nil) {
				t.Errorf("%s: %v, want %v", c.name, err, c.want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: watchDatabaseShutdown did not return", c.name)
		}
	}
	if IsFatal(fmt.Errorf("session: %w", ErrDatabaseShuttingDown)) {
		t.Fatal("ErrDatabaseShuttingDown ends the relay instead of a session")
	}
}
