package coalesce

import (
	"errors"
	"net"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// Abort wakes a Write waiting for room and a Flush waiting for the writer,
// both blocked behind a write the wrapped connection never finishes, and
// every later call fails at once. In a synctest bubble, so the check that
// neither returned before Abort comes once both are seen waiting.
func TestAbortWakesAWaitingWriteAndFlush(t *testing.T) {
	synctest.Test(t, abortWakesAWaitingWriteAndFlush)
}

func abortWakesAWaitingWriteAndFlush(t *testing.T) {
	g := newGate()
	c := New(g, 2)
	mustWrite(t, c, "1")
	wait(t, g.entered, "the first write") // stuck: the gate is never released
	mustWrite(t, c, "23")
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write([]byte("4"))
		wrote <- err
	}()
	flushed := make(chan error, 1)
	go func() { flushed <- c.Flush() }()
	blockedIn(t, "coalesce.(*Conn).Write", "coalesce.(*Conn).Flush")
	for _, ch := range []chan error{wrote, flushed} {
		select {
		case err := <-ch:
			t.Fatalf("returned (%v) before Abort although the writer is stuck", err)
		default:
		}
	}

	c.Abort()
	for what, ch := range map[string]chan error{"Write": wrote, "Flush": flushed} {
		select {
		case err := <-ch:
			if !errors.Is(err, ErrAborted) || !errors.Is(err, net.ErrClosed) {
				t.Fatalf("waiting %s after Abort: %v, want ErrAborted (net.ErrClosed)", what, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Abort did not wake the waiting %s", what)
		}
	}
	wait(t, g.closed, "the wrapped connection to close")
	wait(t, c.done, "the writer to return")
	if _, err := c.Write([]byte("5")); !errors.Is(err, ErrAborted) {
		t.Fatalf("Write after Abort: %v, want ErrAborted", err)
	}
	if err := c.Flush(); !errors.Is(err, ErrAborted) {
		t.Fatalf("Flush after Abort: %v, want ErrAborted", err)
	}
	c.Abort() // again: harmless
	closed := make(chan struct{})
	go func() {
		_ = c.Close()
		close(closed)
	}()
	wait(t, closed, "Close after Abort")
}

// Over a real socket whose peer stopped reading (a broker under a memory
// alarm), a Write blocks once the kernel buffers and the gather buffer are
// full; Abort releases it, the writer's system call fails, and no goroutine
// of this package is left.
func TestAbortReleasesAWriteStuckOnAFullSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan net.Conn, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			peer <- nil
			return
		}
		peer <- s // never read from
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-peer
	if s == nil {
		t.Fatal("accept failed")
	}
	defer s.Close()
	c := New(raw, 64<<10)

	stuck := make(chan error, 1)
	go func() {
		chunk := make([]byte, 32<<10)
		for {
			if _, err := c.Write(chunk); err != nil {
				stuck <- err
				return
			}
		}
	}()
	// The writer keeps writing until the kernel buffers are full; then one
	// Write waits for room for good. Wait until it has waited a while.
	deadline := time.Now().Add(30 * time.Second)
	for !writerBlocked(c) || !goroutineWaiting("coalesce.(*Conn).Write") {
		if time.Now().After(deadline) {
			t.Fatalf("no Write blocked on a socket whose peer does not read:\n%s", goroutines())
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.Abort()
	select {
	case err := <-stuck:
		if !errors.Is(err, ErrAborted) {
			t.Fatalf("stuck Write after Abort: %v, want ErrAborted", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("Abort did not release the stuck Write:\n%s", goroutines())
	}
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		t.Fatalf("the writer is still in its system call after Abort:\n%s", goroutines())
	}
	if dump := goroutines(); strings.Contains(dump, "coalesce.(*Conn)") {
		t.Fatalf("goroutines of the aborted connection remain:\n%s", dump)
	}
}

// writerBlocked reports whether the writer holds bytes it could not hand
// over and more are waiting behind them.
func writerBlocked(c *Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writing && len(c.pending) > 0
}

// blockedIn waits until every goroutine of the synctest bubble is blocked,
// then fails unless one is blocked in each of fns: the evidence that a
// "has not returned" check is about a call that got as far as waiting.
func blockedIn(t *testing.T, fns ...string) {
	t.Helper()
	synctest.Wait()
	for _, fn := range fns {
		if !goroutineWaiting(fn) {
			t.Fatalf("no goroutine waits in %s:\n%s", fn, goroutines())
		}
	}
}

func goroutineWaiting(fn string) bool { return strings.Contains(goroutines(), fn) }

func goroutines() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}
