package testenv

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBackgroundStopReturnsTheResult(t *testing.T) {
	want := errors.New("stopped")
	b := Go(func(ctx context.Context) error {
		<-ctx.Done()
		return want
	})
	if exited, _ := b.Exited(); exited {
		t.Fatal("Exited before Stop")
	}
	for range 2 { // a second Stop gives the same result
		if err := b.Stop(); !errors.Is(err, want) {
			t.Fatalf("Stop = %v, want %v", err, want)
		}
	}
	if exited, err := b.Exited(); !exited || !errors.Is(err, want) {
		t.Fatalf("Exited = %v, %v after Stop", exited, err)
	}
}

func TestBackgroundWaitSeesAnExit(t *testing.T) {
	want := errors.New("gave up")
	release := make(chan struct{})
	b := Go(func(context.Context) error {
		<-release
		return want
	})
	polled := 0
	b.WaitFor(t, 5*time.Second, "polled three times", func() bool { polled++; return polled >= 3 })
	close(release)
	if err := b.Wait(t, 5*time.Second, "release"); !errors.Is(err, want) {
		t.Fatalf("Wait = %v, want %v", err, want)
	}
}
