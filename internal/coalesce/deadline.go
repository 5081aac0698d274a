package coalesce

import "time"

// This file keeps a read deadline alive while bytes arrive.
//
// amqp091-go bounds each read by a deadline of three heartbeat intervals,
// which its heartbeat goroutine moves forward after every frame read. That
// goroutine also sends the client's heartbeats, through the same lock as
// every publish: while a publish is blocked in Write (a broker under a
// resource alarm stops reading, the socket's buffers and this Conn's fill,
// and Write waits for room), the heartbeat goroutine waits behind it and
// the deadline stops moving, though the broker keeps sending heartbeats.
// The read then times out and a connection that is only blocked is taken
// for dead: the session ends and starts again, churning instead of waiting
// (invariant 5, docs/architecture.md). Conn moves the deadline itself.

// SetReadDeadline sets the wrapped connection's read deadline and
// remembers how far ahead of now it is: Read moves it that far ahead
// again whenever bytes arrive. The zero time clears both.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.remember(t)
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline is net.Conn's, with the read side remembered as in
// SetReadDeadline.
func (c *Conn) SetDeadline(t time.Time) error {
	c.remember(t)
	return c.Conn.SetDeadline(t)
}

func (c *Conn) remember(t time.Time) {
	window := time.Duration(0)
	if !t.IsZero() {
		window = max(time.Until(t), 1)
	}
	c.readWindow.Store(int64(window))
}

// Read reads from the wrapped connection. Bytes received show the peer
// alive: a read deadline in force is moved to the same distance from now
// that it was set with, so only a peer silent for that long fails a read.
func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		if w := time.Duration(c.readWindow.Load()); w > 0 {
			_ = c.Conn.SetReadDeadline(time.Now().Add(w))
		}
	}
	return n, err
}
