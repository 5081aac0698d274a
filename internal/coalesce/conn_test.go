package coalesce

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// gate is a net.Conn whose writes block until released, and which records
// each write it was given.
type gate struct {
	net.Conn // nil: only Write and Close are used
	mu       sync.Mutex
	writes   [][]byte
	entered  chan struct{} // a write has started
	release  chan struct{} // each receive lets one write finish
	err      error         // returned by every write, if set
	closed   chan struct{}
	once     sync.Once
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}, 100), release: make(chan struct{}, 100), closed: make(chan struct{})}
}

func (g *gate) Write(p []byte) (int, error) {
	g.entered <- struct{}{}
	select {
	case <-g.release:
	case <-g.closed:
		return 0, net.ErrClosed
	}
	if g.err != nil {
		return 0, g.err
	}
	g.mu.Lock()
	g.writes = append(g.writes, bytes.Clone(p))
	g.mu.Unlock()
	return len(p), nil
}

func (g *gate) Close() error {
	g.once.Do(func() { close(g.closed) })
	return nil
}

func (g *gate) recorded() [][]byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([][]byte(nil), g.writes...)
}

func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func mustWrite(t *testing.T, c *Conn, s string) {
	t.Helper()
	if n, err := c.Write([]byte(s)); err != nil || n != len(s) {
		t.Fatalf("Write(%q) = %d, %v", s, n, err)
	}
}

// While one write is in the system call, later ones gather and leave
// together in the next.
func TestWritesGatherBehindABusyWriter(t *testing.T) {
	g := newGate()
	c := New(g, 0)
	defer c.Close()

	mustWrite(t, c, "a")
	wait(t, g.entered, "the first write")
	for _, s := range []string{"b", "c", "d"} {
		mustWrite(t, c, s) // returns although the first write is stuck
	}
	g.release <- struct{}{}
	wait(t, g.entered, "the second write")
	g.release <- struct{}{}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	got := g.recorded()
	if len(got) != 2 || string(got[0]) != "a" || string(got[1]) != "bcd" {
		t.Fatalf("writes = %q, want [a bcd]", got)
	}
}

// A Write that would take the buffer past its limit waits for the writer.
// In a synctest bubble: it is seen waiting before the check that it has
// not returned.
func TestWriteWaitsAtTheLimit(t *testing.T) { synctest.Test(t, writeWaitsAtTheLimit) }

func writeWaitsAtTheLimit(t *testing.T) {
	g := newGate()
	c := New(g, 4)
	defer c.Close()

	mustWrite(t, c, "1")
	wait(t, g.entered, "the first write")
	mustWrite(t, c, "234") // pending "234": at the limit of 4 with the next byte
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		mustWrite(t, c, "56")
	}()
	blockedIn(t, "coalesce.(*Conn).Write")
	select {
	case <-returned:
		t.Fatal("Write past the limit returned before the writer took the buffer")
	default:
	}
	g.release <- struct{}{} // "1" done; the writer takes "234", making room
	wait(t, returned, "the waiting Write")
	g.release <- struct{}{}
	g.release <- struct{}{}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := string(bytes.Join(g.recorded(), nil)); got != "123456" {
		t.Fatalf("bytes written = %q, want 123456", got)
	}
}

// After a failed write every Write fails and the connection is closed, so
// its reader fails too.
func TestWriteErrorIsSticky(t *testing.T) {
	g := newGate()
	g.err = errors.New("broken pipe")
	c := New(g, 0)
	defer c.Close()

	mustWrite(t, c, "x")
	wait(t, g.entered, "the write")
	g.release <- struct{}{}
	// fail records the error before it closes the connection.
	wait(t, g.closed, "the wrapped connection to close")
	if _, err := c.Write([]byte("y")); err == nil || err.Error() != "broken pipe" {
		t.Fatalf("Write after failure: %v, want broken pipe", err)
	}
	if err := c.Flush(); err == nil || err.Error() != "broken pipe" {
		t.Fatalf("Flush after failure: %v, want broken pipe", err)
	}
}

// Close wakes a Write waiting for room and stops the writer. In a synctest
// bubble: Close comes once the Write is seen waiting.
func TestCloseReleasesAWaitingWrite(t *testing.T) {
	synctest.Test(t, closeReleasesAWaitingWrite)
}

func closeReleasesAWaitingWrite(t *testing.T) {
	g := newGate()
	c := New(g, 2)
	mustWrite(t, c, "1")
	wait(t, g.entered, "the first write")
	mustWrite(t, c, "23")
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write([]byte("4"))
		errc <- err
	}()
	blockedIn(t, "coalesce.(*Conn).Write")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("waiting Write after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not release the waiting Write")
	}
	if _, err := c.Write([]byte("5")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v, want net.ErrClosed", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// Over a real socket, concurrent writers' bytes all arrive, each Write
// whole and in the order the writes returned for one writer.
func TestBytesArriveWholeOverTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	received := make(chan []byte, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			received <- nil
			return
		}
		defer s.Close()
		b, _ := io.ReadAll(s)
		received <- b
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := New(raw, 1024)

	const writers, each = 4, 2000
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				// One record per Write: writer, sequence, terminator.
				rec := []byte{byte('A' + w), byte(i >> 8), byte(i), '\n'}
				if _, err := c.Write(rec); err != nil {
					t.Errorf("write: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := raw.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	b := <-received
	_ = c.Close()
	if len(b) != writers*each*4 {
		t.Fatalf("received %d bytes, want %d", len(b), writers*each*4)
	}
	next := make([]int, writers)
	for off := 0; off < len(b); off += 4 {
		w, i := int(b[off]-'A'), int(b[off+1])<<8|int(b[off+2])
		if w < 0 || w >= writers || b[off+3] != '\n' || i != next[w] {
			t.Fatalf("record at %d = %q: writer %d seq %d, want seq %d (torn or reordered)", off, b[off:off+4], w, i, next[w])
		}
		next[w]++
	}
}

// Flush returns only once the writer has handed over every byte. In a
// synctest bubble: Flush is seen waiting before the check that it has not
// returned.
func TestFlushWaitsForTheWriter(t *testing.T) { synctest.Test(t, flushWaitsForTheWriter) }

func flushWaitsForTheWriter(t *testing.T) {
	g := newGate()
	c := New(g, 0)
	defer c.Close()
	mustWrite(t, c, "a")
	wait(t, g.entered, "the first write")
	mustWrite(t, c, "b")
	flushed := make(chan error, 1)
	go func() { flushed <- c.Flush() }()
	g.release <- struct{}{} // "a"
	wait(t, g.entered, "the second write")
	blockedIn(t, "coalesce.(*Conn).Flush")
	select {
	case err := <-flushed:
		t.Fatalf("Flush returned (%v) while %q was still being written", err, "b")
	default:
	}
	g.release <- struct{}{} // "b"
	select {
	case err := <-flushed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Flush did not return")
	}
	if got := string(bytes.Join(g.recorded(), nil)); got != "ab" {
		t.Fatalf("written %q, want ab", got)
	}
}
