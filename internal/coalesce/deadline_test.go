package coalesce

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// TestReadDeadlineMovesWhileBytesArrive: a peer that sends a byte every
// 50 ms keeps reads with a 200 ms deadline going for a second (the
// heartbeat goroutine that would move the deadline is stuck behind a
// blocked write); a peer that then falls silent fails the read once the
// deadline passes; the zero time clears it.
func TestReadDeadlineMovesWhileBytesArrive(t *testing.T) {
	a, b := net.Pipe()
	c := New(a, 0)
	defer func() { _ = c.Close(); _ = b.Close() }()
	if err := c.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := b.Write([]byte{1}); err != nil {
					return
				}
			}
		}
	}()
	buf := make([]byte, 1)
	began := time.Now()
	for time.Since(began) < time.Second {
		if _, err := c.Read(buf); err != nil {
			t.Fatalf("read after %s with bytes arriving every 50 ms: %v", time.Since(began).Round(time.Millisecond), err)
		}
	}
	close(stop)
	<-sent
	_, err := c.Read(buf)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read from a silent peer: %v, want the deadline exceeded", err)
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = b.Write([]byte{2}) }()
	if _, err := c.Read(buf); err != nil || buf[0] != 2 {
		t.Fatalf("read with the deadline cleared: %v %v", buf, err)
	}
	if w := c.readWindow.Load(); w != 0 {
		t.Fatalf("window %d after the deadline was cleared", w)
	}
}
