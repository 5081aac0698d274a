package publish

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"
)

// fakeBroker is a confirm-mode RabbitMQ as amqp091-go (v1.16) presents it
// to the publisher, for the pipeline model test (model_test.go). It mimics
// the client library, not the wire:
//   - each publish takes the channel's next delivery tag and gets a
//     confirmation whose Done is closed exactly once (confirms.go,
//     deferredConfirmations);
//   - confirms come in any order; an ack or nack with multiple resolves
//     every outstanding confirmation with a tag at or below it
//     (ConfirmMultiple);
//   - a basic.return is handed to the lane's returns channel before the ack
//     of the same message resolves it (channel.go dispatch: notifyAll of the
//     returns, then the confirm);
//   - a channel shutdown marks the channel closed, sends the error (if any)
//     to NotifyClose, closes the NotifyClose and NotifyReturn channels, then
//     resolves every outstanding confirmation as nacked (closeResources,
//     confirms.Close);
//   - a connection shutdown first sends its error to the connection's
//     NotifyClose, shuts every channel down, then closes the connection's
//     NotifyClose and NotifyBlocked channels;
//   - publishing on a closed channel fails with amqp.ErrClosed.
//
// What happens to a message is decided when it is published, as RabbitMQ
// routes a channel's messages in arrival order: enqueued (later acked),
// refused (later nacked) or unroutable (returned, then acked). A dropped
// connection may also lose the unconfirmed tail of what was sent.
type fakeBroker struct {
	mu  sync.Mutex
	rng *rand.Rand

	exchange    string // the relay's exchange
	dlx         string // dead-letter exchange, "" if none
	channels    int
	window      int     // unconfirmed messages a channel may have, if > 0
	pNack       float64 // chance that a publish is refused
	stickyNack  bool    // a channel that refused once refuses the rest of its session
	pUnroutable float64 // chance per session that one routing key has no binding
	keys        []string
	wellBehaved bool // enqueue and ack everything from now on
	// keyFates, when set, fixes the fate of the main exchange's messages
	// by routing key (the sink conformance suite); others go by chance.
	keyFates map[string]fate

	session    int
	conn       *fakeConn
	unroutable string
	// Per session: main-exchange messages acked (not returned), dead-letter
	// messages acked, nacks and returns sent while the channel was open.
	sessionAcked map[string]bool
	dlxAcked     map[string]bool
	nacks        int
	returns      int

	// Per lane (= channel index): what the queues received, in order, over
	// all sessions, and per session and lane the messages refused.
	log     [][]logEntry
	refused map[[2]int][]logEntry
	everDLX map[string]bool
	dlxSent map[string]bool // a dead-letter copy was published, whatever became of it

	stats    modelStats
	problems []string
}

type logEntry struct {
	id       string
	session  int
	tag      uint64
	returned bool // refused as unroutable rather than nacked
}

type fate int

const (
	fateEnqueue fate = iota
	fateNack
	fateReturn
)

// fakeConn is the fake's sink (sink.go), fakeChannel its lanes.
type fakeConn struct {
	b           *fakeBroker
	closed      chan *closure
	blockNotify chan Flow
	isClosed    bool
	chans       []*fakeChannel
}

type fakeChannel struct {
	b        *fakeBroker
	index    int
	returned chan amqp.Return
	closed   chan *closure
	reason   atomic.Pointer[closure] // set before closed is closed
	shut     atomic.Bool
	tag      uint64
	out      map[uint64]*fakeMsg // outstanding confirmations by delivery tag
	maxConf  uint64              // highest tag confirmed
	nacking  bool
}

// fakeMsg is a published message and its deferred confirmation.
type fakeMsg struct {
	tag      uint64
	id       string
	exchange string
	key      string
	headers  amqp.Table
	fate     fate
	done     chan struct{}
	ack      bool
}

func (m *fakeMsg) Done() <-chan struct{} { return m.done }

// Acked is amqp.DeferredConfirmation.Acked: false until resolved.
func (m *fakeMsg) Acked() bool {
	select {
	case <-m.done:
		return m.ack
	default:
		return false
	}
}

func newFakeBroker(seed uint64, channels int) *fakeBroker {
	return &fakeBroker{
		rng: rand.New(rand.NewPCG(seed, seed^1)), exchange: "outbox", channels: channels,
		keys: []string{"k"}, log: make([][]logEntry, channels), refused: map[[2]int][]logEntry{}, everDLX: map[string]bool{}, dlxSent: map[string]bool{},
	}
}

func (b *fakeBroker) problem(format string, args ...any) {
	b.problems = append(b.problems, fmt.Sprintf(format, args...))
}

// connect opens a new connection with n confirm channels, sized as
// Link.setup sizes its notification channels: the sink the publisher uses.
func (b *fakeBroker) connect(returnsBuf int) (*fakeConn, sink) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.session++
	b.sessionAcked = map[string]bool{}
	b.dlxAcked = map[string]bool{}
	b.nacks, b.returns = 0, 0
	b.unroutable = ""
	if !b.wellBehaved && b.rng.Float64() < b.pUnroutable {
		b.unroutable = b.keys[b.rng.IntN(len(b.keys))]
	}
	c := &fakeConn{b: b, closed: make(chan *closure, 1), blockNotify: make(chan Flow, 8)}
	for i := range b.channels {
		ch := &fakeChannel{
			b: b, index: i, out: map[uint64]*fakeMsg{},
			returned: make(chan amqp.Return, max(returnsBuf, 1)),
			closed:   make(chan *closure, 1),
		}
		c.chans = append(c.chans, ch)
	}
	b.conn = c
	return c, c
}

func (c *fakeConn) lanes() []sinkLane {
	out := make([]sinkLane, len(c.chans))
	for i, ch := range c.chans {
		out[i] = ch
	}
	return out
}

func (c *fakeConn) connClosed() <-chan *closure { return c.closed }
func (c *fakeConn) flow() <-chan Flow           { return c.blockNotify }

// unsendable judges by AMQP's rules, as the Link does, with no frame size
// negotiated.
func (c *fakeConn) unsendable(exchange, key string, msg *Message) string {
	return amqpUnsendable(exchange, key, msg, 0)
}

// Abort is a dropped socket: the connection shuts down with an error, and
// the broker keeps what it received.
func (c *fakeConn) Abort() {
	c.b.closeConn(c, &amqp.Error{Code: amqp.FrameError, Reason: "socket closed by Abort"}, false)
}

func (c *fakeChannel) isClosed() bool { return c.shut.Load() }

func (c *fakeChannel) closing() <-chan *closure { return c.closed }
func (c *fakeChannel) closeReason() *closure    { return c.reason.Load() }

// nextReturn reads the returns channel the fake fills as amqp091-go
// fills a lane's (link.go, lane.nextReturn).
func (c *fakeChannel) nextReturn() (Returned, bool) {
	select {
	case r, ok := <-c.returned:
		if ok {
			return returnedOf(r), true
		}
	default:
	}
	return Returned{}, false
}

// publish is amqp091-go's PublishWithDeferredConfirmWithContext with
// mandatory set, as Link's lanes call it, on the message as the Link
// converts it (publishing).
func (c *fakeChannel) publish(ctx context.Context, exchange, key string, sent *Message) (confirmation, error) {
	const mandatory = true
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	default:
	}
	msg := publishing(sent)
	if err := msg.Headers.Validate(); err != nil {
		return nil, &unencodable{err: err} // as the Link classifies an encoding error
	}
	b := c.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.shut.Load() {
		return nil, amqp.ErrClosed
	}
	if !mandatory || msg.DeliveryMode != amqp.Persistent {
		b.problem("event %s published with mandatory=%v delivery mode %d", msg.MessageId, mandatory, msg.DeliveryMode)
	}
	main := exchange == b.exchange
	if main && LaneOf(key, b.channels) != c.index {
		b.problem("event %s (key %q) published on channel %d, its lane is %d", msg.MessageId, key, c.index, LaneOf(key, b.channels))
	}
	if !main && exchange != b.dlx {
		b.problem("event %s published to unknown exchange %q", msg.MessageId, exchange)
	}
	c.tag++
	m := &fakeMsg{tag: c.tag, id: msg.MessageId, exchange: exchange, key: key, headers: msg.Headers, done: make(chan struct{}), fate: c.decide(main, key)}
	c.out[c.tag] = m
	b.stats.published++
	e := logEntry{id: m.id, session: b.session, tag: m.tag}
	switch {
	case !main:
		b.dlxSent[m.id] = true
	case m.fate == fateEnqueue:
		b.log[c.index] = append(b.log[c.index], e)
	default:
		e.returned = m.fate == fateReturn
		k := [2]int{b.session, c.index}
		b.refused[k] = append(b.refused[k], e)
	}
	if b.window > 0 && len(c.out) > b.window {
		b.problem("channel %d has %d messages unconfirmed, the window is %d", c.index, len(c.out), b.window)
	}
	return m, nil
}

// decide routes a message on arrival. Caller holds mu.
func (c *fakeChannel) decide(main bool, key string) fate {
	b := c.b
	f, fixed := b.keyFates[key]
	switch {
	case main && fixed:
		return f
	case b.wellBehaved:
		return fateEnqueue
	case c.nacking:
		return fateNack
	case main && key == b.unroutable:
		return fateReturn
	case b.rng.Float64() < b.pNack:
		c.nacking = b.stickyNack
		return fateNack
	}
	return fateEnqueue
}

// outstanding returns the channels with unconfirmed messages. Caller holds mu.
func (b *fakeBroker) outstanding() []*fakeChannel {
	var chans []*fakeChannel
	if b.conn == nil || b.conn.isClosed {
		return nil
	}
	for _, c := range b.conn.chans {
		if len(c.out) > 0 {
			chans = append(chans, c)
		}
	}
	return chans
}

// confirmOne confirms one random outstanding message, or, with multiple,
// every outstanding message up to it when they all get the same answer
// (as RabbitMQ's multiple flag does). It reports whether there was one.
func (b *fakeBroker) confirmOne(multiple bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.confirm(multiple, false)
}

// confirmBurst confirms up to n messages of one channel, oldest first, in
// one go: the publisher then finds several answers (and returns) waiting
// at once instead of being woken by each.
func (b *fakeBroker) confirmBurst(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for range n {
		if !b.confirm(false, true) {
			return
		}
	}
}

// confirm is confirmOne, or the oldest outstanding message of the first
// busy channel with oldest. Caller holds mu.
func (b *fakeBroker) confirm(multiple, oldest bool) bool {
	chans := b.outstanding()
	if len(chans) == 0 {
		return false
	}
	c := chans[b.rng.IntN(len(chans))]
	if oldest {
		c = chans[0]
	}
	tags := make([]uint64, 0, len(c.out))
	for t := range c.out {
		tags = append(tags, t)
	}
	slices.Sort(tags)
	i := b.rng.IntN(len(tags))
	if oldest || (b.wellBehaved && b.rng.IntN(2) == 0) {
		i = 0 // mostly in order, so the final run makes progress
	}
	ack := c.out[tags[i]].fate != fateNack
	group := tags[i : i+1]
	if multiple {
		group = tags[:i+1]
		for _, t := range group {
			if (c.out[t].fate != fateNack) != ack {
				group = tags[i : i+1]
				break
			}
		}
	}
	// The broker sends basic.return when it routes, so before the ack.
	for _, t := range group {
		if m := c.out[t]; m.fate == fateReturn {
			b.returns++
			b.stats.returns++
			r := amqp.Return{ReplyCode: amqp.NoRoute, ReplyText: "NO_ROUTE", Exchange: m.exchange, RoutingKey: m.key, MessageId: m.id, Headers: m.headers}
			select {
			case c.returned <- r:
			default:
				// amqp091-go would block its reader for 5 s, then drop it.
				b.problem("returns buffer of channel %d full: return of %s would be dropped", c.index, m.id)
			}
		}
	}
	if len(group) > 1 {
		b.stats.multiple++
	}
	// Resolved in map order, as deferredConfirmations.ConfirmMultiple does.
	for t, m := range c.out {
		if t > tags[i] || (len(group) == 1 && t != tags[i]) {
			continue
		}
		b.resolve(c, m, ack)
	}
	return true
}

// resolve records the broker's answer, then settles the confirmation (so
// that whatever the publisher learns from it is already recorded). Caller
// holds mu.
func (b *fakeBroker) resolve(c *fakeChannel, m *fakeMsg, ack bool) {
	switch {
	case !ack:
		b.nacks++
		b.stats.nacks++
	case m.exchange == b.dlx && b.dlx != "":
		b.dlxAcked[m.id] = true
		b.everDLX[m.id] = true
	case m.fate == fateEnqueue:
		b.sessionAcked[m.id] = true
		b.stats.acks++
	}
	c.maxConf = max(c.maxConf, m.tag)
	m.ack = ack
	close(m.done)
	delete(c.out, m.tag)
}

// shutdown is amqp091-go's Channel.shutdown, its reason classified as
// Link's lanes classify it. Caller holds mu.
func (c *fakeChannel) shutdown(e *amqp.Error) {
	if c.shut.Load() {
		return
	}
	c.shut.Store(true)
	if e != nil {
		r := classifyClose(e)
		c.reason.Store(r)
		select { // buffered: Link.setup gives NotifyClose room for one
		case c.closed <- r:
		default:
		}
	}
	close(c.closed)
	close(c.returned)
	for t, m := range c.out { // confirms.Close: every pending one nacked
		m.ack = false
		close(m.done)
		delete(c.out, t)
	}
}

// closeChannel closes one random open channel with a channel exception.
func (b *fakeBroker) closeChannel() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conn == nil || b.conn.isClosed {
		return
	}
	b.stats.channelCloses++
	c := b.conn.chans[b.rng.IntN(len(b.conn.chans))]
	// Not a 406 or a 404: those are about the message in flight, which a
	// careful session blames (returns.go); this fault is the broker's own.
	c.shutdown(&amqp.Error{Code: amqp.InternalError, Reason: "INTERNAL_ERROR - model", Server: true})
}

// closeConn is amqp091-go's Connection.shutdown: e nil for the client's
// own close (Link.Close), else a dropped connection, which may also lose
// what the broker had not received yet.
func (b *fakeBroker) closeConn(c *fakeConn, e *amqp.Error, lose bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.isClosed {
		return
	}
	c.isClosed = true
	if e != nil {
		b.stats.drops++
		select {
		case c.closed <- classifyClose(e):
		default:
		}
	}
	for _, ch := range c.chans {
		if lose {
			b.loseTail(ch)
		}
		ch.shutdown(e)
	}
	close(c.closed)
	close(c.blockNotify)
}

// loseTail drops the messages the broker never received: a suffix of the
// channel's unconfirmed ones (a confirmed message was received, and so
// was everything before it). Caller holds mu.
func (b *fakeBroker) loseTail(c *fakeChannel) {
	if c.tag == c.maxConf {
		return
	}
	keep := c.maxConf + uint64(b.rng.IntN(int(c.tag-c.maxConf)+1))
	log := b.log[c.index]
	for len(log) > 0 && log[len(log)-1].session == b.session && log[len(log)-1].tag > keep {
		log = log[:len(log)-1]
		b.stats.lost++
	}
	b.log[c.index] = log
}

// block sends a flow-control notification, as the connection's reader
// does on connection.blocked / unblocked.
func (b *fakeBroker) block(active bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.conn == nil || b.conn.isClosed {
		return
	}
	select {
	case b.conn.blockNotify <- Flow{Blocked: active, Reason: "model"}:
	default:
	}
}
