// Package coalesce gathers a connection's writes so that many small ones
// leave in one system call.
//
// amqp091-go flushes its buffered writer after every message, which costs
// one write(2) per event: on a virtual machine that is a large share of
// the relay's CPU, and each small segment costs the broker a read of its
// own. Conn instead copies each Write into a buffer and returns; one
// goroutine writes whatever has gathered. While it is in a system call,
// the next messages gather behind it, so a busy connection makes few large
// writes and an idle one writes each message as soon as it comes.
//
// Nothing is acknowledged on the strength of a Write: the relay counts a
// message only when the broker confirms it, so bytes buffered here when
// the connection fails are simply never confirmed, and the events are
// published again from the slot.
package coalesce

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// DefaultLimit bounds the bytes waiting to be written; a Write that would
// go past it waits until the writer has taken the buffer.
const DefaultLimit = 256 << 10

// ErrAborted is what writes return after Abort. It wraps net.ErrClosed.
var ErrAborted = fmt.Errorf("connection aborted: %w", net.ErrClosed)

// Conn is a net.Conn whose writes are gathered and written by one
// goroutine. Reads and addresses are the wrapped connection's; a read
// deadline moves forward while bytes arrive (deadline.go).
type Conn struct {
	net.Conn
	limit int

	mu sync.Mutex
	// room is signalled whenever the writer takes the buffer or stops, so a
	// Write waiting for space wakes up.
	room    sync.Cond
	pending []byte // written by callers, not yet taken by the writer
	err     error  // the first write error; every later Write returns it
	closed  bool
	writing bool // the writer holds bytes taken from pending

	// readWindow is how far ahead the last read deadline was set, in
	// nanoseconds; 0: none (deadline.go).
	readWindow atomic.Int64

	kick chan struct{} // capacity 1: pending went from empty to non-empty
	stop chan struct{} // closed by Close
	done chan struct{} // closed when the writer goroutine has returned
	once sync.Once
}

// New wraps c and starts its writer; limit <= 0 means DefaultLimit. Close
// stops the writer.
func New(c net.Conn, limit int) *Conn {
	if limit <= 0 {
		limit = DefaultLimit
	}
	w := &Conn{
		Conn:  c,
		limit: limit,
		kick:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	w.room.L = &w.mu
	go w.writer()
	return w
}

// Write copies p for the writer and returns. It fails once a write has
// failed or the connection is closed.
func (c *Conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	// Back-pressure: wait while the buffer is over its limit. A single
	// Write larger than the limit still goes through, alone.
	for c.err == nil && !c.closed && len(c.pending) > 0 && len(c.pending)+len(p) > c.limit {
		c.room.Wait()
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	if c.closed {
		c.mu.Unlock()
		return 0, net.ErrClosed
	}
	wake := len(c.pending) == 0
	c.pending = append(c.pending, p...)
	c.mu.Unlock()
	// Invariant: pending non-empty implies a kick is queued or the writer
	// will look at pending again before it sleeps (it re-checks under mu
	// after every write), so no byte waits for a later Write to move it.
	if wake {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// writer owns the wrapped connection's write side: it is the only
// goroutine that writes to it.
func (c *Conn) writer() {
	defer close(c.done)
	var out []byte
	for {
		select {
		case <-c.kick:
		case <-c.stop:
			return
		}
		for {
			c.mu.Lock()
			if len(c.pending) == 0 {
				c.writing = false
				c.room.Broadcast() // for Flush
				c.mu.Unlock()
				break
			}
			// Swap buffers: callers fill the other one during the write.
			out, c.pending = c.pending, out[:0]
			c.writing = true
			c.room.Broadcast()
			c.mu.Unlock()
			if _, err := c.Conn.Write(out); err != nil {
				c.fail(err)
				return
			}
		}
	}
}

// Flush waits until every byte written so far has been handed to the
// wrapped connection, and reports the write error if one failed.
func (c *Conn) Flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.err == nil && !c.closed && (c.writing || len(c.pending) > 0) {
		c.room.Wait()
	}
	if c.err != nil {
		return c.err
	}
	if c.closed {
		return net.ErrClosed
	}
	return nil
}

// fail records a write error and closes the connection, so that its reader
// fails too and the owner notices even if it never writes again. The first
// error stays: after Abort, the writer's own failure is only its echo.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.pending = nil
	c.room.Broadcast()
	c.mu.Unlock()
	_ = c.Conn.Close()
}

// Close stops the writer and closes the wrapped connection. Bytes not yet
// written are dropped: callers that need them delivered wait for the
// peer's answer before closing, as AMQP's connection.close does.
func (c *Conn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.room.Broadcast()
	c.mu.Unlock()
	var err error
	c.once.Do(func() {
		close(c.stop)
		err = c.Conn.Close()
	})
	<-c.done
	return err
}

// Abort closes the wrapped connection now and fails every pending and later
// Write and Flush with ErrAborted, waking those that wait for room. Unlike
// Close it waits for nothing, so it ends a connection whatever holds it:
// a Write stuck behind a peer that stopped reading, held under the AMQP
// client's locks, returns at once (its caller then releases them), the
// writer's system call fails, and a reader sees the socket closed. It is
// safe to call from any goroutine, more than once, and before or after
// Close.
func (c *Conn) Abort() {
	c.mu.Lock()
	if c.err == nil {
		c.err = ErrAborted
	}
	c.pending = nil
	c.room.Broadcast()
	c.mu.Unlock()
	// If Close got here first, the socket is already closed.
	c.once.Do(func() {
		close(c.stop)
		_ = c.Conn.Close()
	})
}
