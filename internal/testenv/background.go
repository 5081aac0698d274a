package testenv

import (
	"context"
	"errors"
	"testing"
	"time"
)

// ErrStillRunning is what Stop returns when the function has not returned
// within stopWait of being cancelled.
var ErrStillRunning = errors.New("still running 30s after it was asked to stop")

const stopWait = 30 * time.Second

// Background runs a long-lived Run(ctx) function, a relay or a service, for
// a test: Stop cancels it and returns its result; Wait and WaitFor let the
// test wait on it without missing an early exit.
type Background struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // fn's result; set before done is closed
}

// Go starts fn with a context that Stop cancels.
func Go(fn func(context.Context) error) *Background {
	ctx, cancel := context.WithCancel(context.Background())
	b := &Background{cancel: cancel, done: make(chan struct{})}
	go func() {
		b.err = fn(ctx)
		close(b.done)
	}()
	return b
}

// Stop cancels fn and returns its result, or ErrStillRunning. It may be
// called again and returns the same result.
func (b *Background) Stop() error {
	b.cancel()
	select {
	case <-b.done:
		return b.err
	case <-time.After(stopWait):
		return ErrStillRunning
	}
}

// Exited reports whether fn has returned, and its result if so.
func (b *Background) Exited() (bool, error) {
	select {
	case <-b.done:
		return true, b.err
	default:
		return false, nil
	}
}

// Wait waits up to within for fn to return by itself and returns its
// result; the test fails if it is still running (what says what was
// expected to end it).
func (b *Background) Wait(tb testing.TB, within time.Duration, what string) error {
	tb.Helper()
	select {
	case <-b.done:
		return b.err
	case <-time.After(within):
		tb.Fatalf("still running after %s: %s", within, what)
		return nil
	}
}

// WaitFor polls cond until it holds; the test fails if fn returns first or
// cond does not hold within the time given.
func (b *Background) WaitFor(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("not %s after %s", what, within)
		}
		select {
		case <-b.done:
			tb.Fatalf("exited before %s: %v", what, b.err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
