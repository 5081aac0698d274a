package netproxy

import (
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestProxyForwards(t *testing.T) {
	t.Parallel()
	p := mustProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "hello")
	roundTrip(t, c, "again")
	if n := p.ActiveConns(); n != 1 {
		t.Errorf("ActiveConns = %d, want 1", n)
	}
}

func TestProxyHoldDownstream(t *testing.T) {
	t.Parallel()
	p := mustProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "warm")

	p.HoldDownstream(true)
	write(t, c, "one")
	write(t, c, "two")
	expectSilence(t, c, 300*time.Millisecond)
	// A connection opened while held is held too.
	c2 := dial(t, p.Addr())
	write(t, c2, "three")
	expectSilence(t, c2, 100*time.Millisecond)

	p.HoldDownstream(false)
	expect(t, c, "onetwo")
	expect(t, c2, "three")
}

func TestProxyHoldUpstream(t *testing.T) {
	t.Parallel()
	p := mustProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	p.HoldUpstream(true)
	write(t, c, "queued")
	expectSilence(t, c, 200*time.Millisecond)
	p.HoldUpstream(false)
	expect(t, c, "queued")
}

// TestProxyHoldUpstreamWhere: only links whose first chunk matches are
// held; the others flow; releasing delivers what was held, in order.
func TestProxyHoldUpstreamWhere(t *testing.T) {
	t.Parallel()
	p := mustProxy(t, echoServer(t))
	held, free := dial(t, p.Addr()), dial(t, p.Addr())
	write(t, held, "replication")
	expect(t, held, "replication")
	write(t, free, "normal")
	expect(t, free, "normal")
	p.HoldUpstreamWhere(func(first []byte) bool { return strings.Contains(string(first), "replication") })
	write(t, held, "queued")
	write(t, free, "passes")
	expect(t, free, "passes")
	expectSilence(t, held, 200*time.Millisecond)
	p.HoldUpstream(false)
	expect(t, held, "queued")
}

func TestProxyReset(t *testing.T) {
	t.Parallel()
	p := mustProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "ping")

	p.Reset()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 8))
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after Reset: err = %v, want the connection broken", err)
	}
	// The proxy itself keeps working.
	roundTrip(t, dial(t, p.Addr()), "pong")
}

func TestProxyBlackhole(t *testing.T) {
	t.Parallel()
	p := mustProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "ping")

	p.Blackhole(true)
	write(t, c, "lost?")
	expectSilence(t, c, 200*time.Millisecond)
	// New connections are accepted but go nowhere.
	c2 := dial(t, p.Addr())
	write(t, c2, "new")
	expectSilence(t, c2, 100*time.Millisecond)

	p.Blackhole(false)
	expect(t, c, "lost?")
	expect(t, c2, "new")
}

func TestProxyClose(t *testing.T) {
	t.Parallel()
	p, err := NewProxy(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	roundTrip(t, c, "x")
	p.HoldDownstream(true) // Close must not hang on a held link
	write(t, c, "y")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Ask the listener itself: dialing the address could reach another
	// test's listener that took the freed port meanwhile.
	if conn, err := p.ln.Accept(); !errors.Is(err, net.ErrClosed) {
		if conn != nil {
			conn.Close()
		}
		t.Errorf("proxy listener still accepts after Close (%v)", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("a proxied connection is still open after Close")
	}
}

// TestProxySetRate: with a rate set, client->target bytes trickle through
// in order, no faster than the rate (a lower bound, so a busy machine cannot
// fail it); SetRate(0) lifts the limit.
func TestProxySetRate(t *testing.T) {
	t.Parallel()
	p := mustProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, "warm")
	const rate = 40 << 10
	p.SetRate(rate)
	msg := strings.Repeat("0123456789abcdef", (20<<10)/16) // 20 KiB: 5 chunks
	began := time.Now()
	write(t, c, msg)
	expect(t, c, msg)
	// Each of the first four chunks is followed by a 100ms pause before
	// the next is sent.
	if took, least := time.Since(began), 4*rateChunk*time.Second/rate; took < least {
		t.Errorf("20 KiB through a %d B/s proxy took %s, less than %s", rate, took, least)
	}
	p.SetRate(0)
	roundTrip(t, c, "free")
}

// echoServer returns the address of a TCP server that echoes everything.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatalf("write %q: %v", s, err)
	}
}

func expect(t *testing.T, c net.Conn, want string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("read %q: got %q, %v", want, buf, err)
	}
	if string(buf) != want {
		t.Fatalf("read %q, want %q", buf, want)
	}
}

func roundTrip(t *testing.T, c net.Conn, s string) {
	t.Helper()
	write(t, c, s)
	expect(t, c, s)
}

// expectSilence asserts nothing arrives on c for d.
func expectSilence(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("expected nothing for %v, got %q, err %v", d, buf[:n], err)
	}
}

// mustProxy starts a proxy to target, closed when the test ends.
func mustProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := NewProxy(target)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close proxy: %v", err)
		}
	})
	return p
}
