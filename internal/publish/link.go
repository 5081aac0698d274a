package publish

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/coalesce"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// ErrNoExchange is returned by Dial when the configured exchange is missing.
var ErrNoExchange = errors.New("exchange does not exist")

// Link is one AMQP connection with its confirm-mode channels, one per
// lane (CDCRELAY_PUBLISH_CHANNELS), and the notification channels the
// publisher watches: the AMQP sink (sink.go). Every notification channel
// is buffered: amqp091-go drops a notification a listener does not take
// within 5 s, and a dropped return would be a silent loss.
type Link struct {
	Conn  *amqp.Connection
	chans []*lane
	// raw is the socket under Conn, which the relay owns: Abort closes it
	// whatever amqp091-go is doing.
	raw *coalesce.Conn

	connNotify chan *closure
	flowNotify chan Flow

	node      string // host:port of the broker node, for logs
	nodeIndex int    // its place in DialOptions.URLs
}

// Node is the host:port of the broker node the link is connected to,
// without credentials: what the relay logs.
func (l *Link) Node() string { return l.node }

// NodeIndex is the place in DialOptions.URLs of the node the link is
// connected to (0 for DialOptions.URL): the caller starts its next Dial
// after it.
func (l *Link) NodeIndex() int { return l.nodeIndex }

// lane is one confirm-mode channel with its own notifications: the AMQP
// sinkLane. Messages on one lane keep their order; lanes are independent
// of each other.
type lane struct {
	ch *amqp.Channel
	// returned is amqp091-go's own return channel, read only by
	// nextReturn: the library sends a return into it before it resolves
	// the confirmation of the same message, which is the order sinkLane
	// promises; a goroutine converting returns would lose it.
	returned chan amqp.Return
	closed   chan *closure // read by the publisher's watch
	// reason is a second close notification, read only through
	// closeReason by the lane's own loops.
	reason chan *amqp.Error

	mu       sync.Mutex
	closeErr *closure
}

// closeReason returns why the broker closed the lane's channel (a 404 for
// a deleted exchange, say), nil when it did not or has not yet. amqp091-go
// sends the reason to every NotifyClose listener before it closes the
// returns channel and resolves the unconfirmed messages, so a loop that
// sees either has the reason here at once; it never waits.
func (l *lane) closeReason() *closure {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closeErr == nil {
		select {
		case e, ok := <-l.reason: // a nil channel (test lanes) is never ready
			if ok {
				l.closeErr = classifyClose(e)
			}
		default:
		}
	}
	return l.closeErr
}

// publish implements sinkLane; a lane without a channel (tests) has
// none to publish on. An error that is not the transport's (transport)
// is amqp091-go refusing to encode msg: the message's own fault.
func (l *lane) publish(ctx context.Context, exchange, key string, msg *Message) (confirmation, error) {
	if l.ch == nil {
		return nil, amqp.ErrClosed
	}
	dc, err := l.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, publishing(msg))
	if err != nil {
		if !transport(err) {
			return nil, &unencodable{err: err}
		}
		// A nil *DeferredConfirmation must not become a non-nil interface.
		return nil, err
	}
	return dc, nil
}

// nextReturn implements sinkLane.
func (l *lane) nextReturn() (Returned, bool) {
	select {
	case r, ok := <-l.returned: // closed with the channel: nothing more to take
		if ok {
			return returnedOf(r), true
		}
	default:
	}
	return Returned{}, false
}

func (l *lane) isClosed() bool              { return l.ch == nil || l.ch.IsClosed() }
func (l *lane) closing() <-chan *closure    { return l.closed }
func (l *Link) connClosed() <-chan *closure { return l.connNotify }
func (l *Link) flow() <-chan Flow           { return l.flowNotify }

// lanes implements sink.
func (l *Link) lanes() []sinkLane {
	out := make([]sinkLane, len(l.chans))
	for i, c := range l.chans {
		out[i] = c
	}
	return out
}

// unsendable implements sink: AMQP's encoding rules and RabbitMQ's, and
// the frame size negotiated with the broker (validate.go).
func (l *Link) unsendable(exchange, key string, msg *Message) string {
	frameMax := 0
	if l.Conn != nil {
		frameMax = l.Conn.Config.FrameSize
	}
	return amqpUnsendable(exchange, key, msg, frameMax)
}

// NewPublisher returns the publisher of one session on link: it publishes
// the events of in and reports their fate to acks, releasing each event's
// weight, which the feeder of in acquired, into budget.
func NewPublisher(link *Link, in <-chan wal.Event, acks Acker, budget Budget, cfg PublisherConfig) *Publisher {
	var s sink
	if link != nil { // a nil *Link must not become a non-nil sink
		s = link
	}
	return newPublisher(s, in, acks, budget, cfg)
}

// classifyClose is the AMQP reading of a close: 406 PRECONDITION_FAILED
// refuses the message in flight (and may name the broker's
// max_message_size), 404 NOT_FOUND names a missing exchange, anything
// else is the broker's own trouble. Nil for nil.
func classifyClose(e *amqp.Error) *closure {
	if e == nil {
		return nil
	}
	c := &closure{code: e.Code, reason: e.Reason, err: e}
	switch e.Code {
	case amqp.PreconditionFailed:
		c.kind = closeRefused
		if limit, ok := BrokerMaxMessageSize(e.Reason); ok {
			c.limit = limit
		}
	case amqp.NotFound:
		c.kind = closeNoExchange
	}
	return c
}

// classified forwards a NotifyClose channel's reason, classified, and
// closes with it: amqp091-go sends the reason, then closes the channel,
// when the channel or connection shuts down, which ends the goroutine.
// The copy may lag, which sinkLane allows for closing (never for returns);
// closeReason reads a NotifyClose channel of its own, without the lag.
func classified(in <-chan *amqp.Error) chan *closure {
	out := make(chan *closure, 1)
	go func() {
		defer close(out)
		for e := range in {
			out <- classifyClose(e)
		}
	}()
	return out
}

// flows forwards connection.blocked and unblocked notifications as Flow
// values and closes with in, which amqp091-go closes when the connection
// shuts down (ending the goroutine). A forwarded copy may lag, which is
// fine for flow control: nothing waits for it in order with a confirm.
// It never blocks: when the reader is a full buffer behind (a session that
// ended and stopped reading), the oldest notification gives way, so the
// newest state still arrives and amqp091-go's reader, which sends into in,
// is never held up.
func flows(in <-chan amqp.Blocking) chan Flow {
	out := make(chan Flow, max(cap(in), 1))
	go func() {
		defer close(out)
		for b := range in {
			f := Flow{Blocked: b.Active, Reason: b.Reason}
			select {
			case out <- f:
			default:
				select {
				case <-out:
				default:
				}
				out <- f // this goroutine is out's only sender: there is room now
			}
		}
	}()
	return out
}

// DialOptions configure Dial.
type DialOptions struct {
	// URLs are the broker nodes, each a single-host AMQP URL
	// (config.Config.AMQPNodes), tried in this order; the first that
	// connects and passes the checks is the link's node.
	URLs []string
	// URL is one node, for callers with one: the same as URLs holding
	// only it. Ignored when URLs is set.
	URL       string
	Heartbeat time.Duration
	Exchanges []string    // checked passively; empty names (the default exchange) are skipped
	Name      string      // connection name shown in the management UI
	Window    int         // in-flight window; sizes the returns buffer
	TLS       *tls.Config // for amqps://; nil uses the system roots
	Channels  int         // confirm channels to open (at least 1)
}

// handshakeTimeout bounds the TCP connect and the TLS and AMQP handshakes.
const handshakeTimeout = 10 * time.Second

// Dial connects to the first node of o.URLs that answers, opens the
// confirm-mode channels (one per lane) and checks the exchanges. A node
// that cannot be dialed or set up is skipped for the next one; a missing
// exchange is not (the nodes of a cluster share their exchanges, so every
// node would say the same). Recovery is left off on purpose: any broker
// failure must restart both sides from the slot, not silently resume on a
// new channel; the caller picks the node the next session tries first.
func Dial(ctx context.Context, o DialOptions) (*Link, error) {
	urls := o.URLs
	if len(urls) == 0 {
		urls = []string{o.URL}
	}
	var failed nodeErrors
	for i, u := range urls {
		// The library's parse errors quote the URL, password included:
		// name the node by its place and address only.
		uri, err := amqp.ParseURI(u)
		if err != nil {
			failed = append(failed, fmt.Errorf("broker node %d of %d: not a valid AMQP URL", i+1, len(urls)))
			continue
		}
		addr := net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
		l, err := dialNode(ctx, u, o)
		if err == nil {
			l.node, l.nodeIndex = addr, i
			return l, nil
		}
		if len(urls) == 1 {
			return nil, err
		}
		err = fmt.Errorf("broker node %s: %w", addr, err)
		if errors.Is(err, ErrNoExchange) || ctx.Err() != nil {
			return nil, err
		}
		failed = append(failed, err)
	}
	if len(failed) == 1 {
		return nil, failed[0]
	}
	return nil, fmt.Errorf("connect to broker: none of its %d nodes answered: %w", len(urls), failed)
}

// nodeErrors are the failures of the nodes Dial tried, on one line (a log
// line each): errors.Join would put each on a line of its own.
type nodeErrors []error

func (e nodeErrors) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (e nodeErrors) Unwrap() []error { return e }

// dialNode connects to one node and sets the link up.
func dialNode(ctx context.Context, url string, o DialOptions) (*Link, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(o.Name)
	dialer := &net.Dialer{Timeout: handshakeTimeout, KeepAlive: 30 * time.Second}
	var raw *coalesce.Conn
	conn, err := amqp.DialConfig(url, amqp.Config{
		Heartbeat:       o.Heartbeat,
		Properties:      props,
		TLSClientConfig: o.TLS,
		Dial: func(network, addr string) (net.Conn, error) {
			conn, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// As amqp.DefaultDial does: a deadline covers the TLS and AMQP
			// handshakes (amqp091-go clears it once the connection is
			// open), so a broker that accepts TCP but never answers fails
			// the attempt instead of hanging the session forever.
			if err := conn.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
				_ = conn.Close()
				return nil, err
			}
			// amqp091-go flushes after every message; gathering those
			// flushes saves a write(2) per event on a busy connection
			// (docs/performance.md). TLS, when used, sits on top.
			raw = coalesce.New(conn, coalesce.DefaultLimit)
			return raw, nil
		},
	})
	if err != nil {
		return nil, fmt.Errorf("connect to broker: %w", err)
	}
	l := &Link{Conn: conn, raw: raw}
	// The setup's calls wait for the broker's answers without a deadline:
	// a stop must not wait for a broker that went silent.
	stop := context.AfterFunc(ctx, l.Abort)
	defer stop()
	if err := l.setup(o); err != nil {
		_ = l.Close()
		return nil, err
	}
	return l, nil
}

func (l *Link) setup(o DialOptions) error {
	for _, name := range o.Exchanges {
		if err := l.checkExchange(name); err != nil {
			return err
		}
	}
	for range max(o.Channels, 1) {
		ch, err := l.Conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		if err := ch.Confirm(false); err != nil {
			return fmt.Errorf("enable publisher confirms: %w", err)
		}
		l.chans = append(l.chans, &lane{
			ch:       ch,
			returned: ch.NotifyReturn(make(chan amqp.Return, max(o.Window, 1))),
			closed:   classified(ch.NotifyClose(make(chan *amqp.Error, 1))),
			reason:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		})
	}
	l.connNotify = classified(l.Conn.NotifyClose(make(chan *amqp.Error, 1)))
	l.flowNotify = flows(l.Conn.NotifyBlocked(make(chan amqp.Blocking, 8)))
	return nil
}

// checkExchange fails when the exchange does not exist; the relay does not
// declare topology.
func (l *Link) checkExchange(name string) error {
	if name == "" {
		return nil
	}
	// A failed passive declare closes its channel, so use a throwaway one.
	probe, err := l.Conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if err := probe.ExchangeDeclarePassive(name, "topic", true, false, false, false, nil); err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return fmt.Errorf("%w: %q (declare it, or change CDCRELAY_EXCHANGE / CDCRELAY_DEAD_LETTER_EXCHANGE)", ErrNoExchange, name)
		}
		return fmt.Errorf("check exchange %q: %w", name, err)
	}
	_ = probe.Close()
	return nil
}

// closeTimeout bounds amqp091-go's close handshake; closeGrace is how long
// Close then waits for it to return before it closes the socket itself.
const (
	closeTimeout = time.Second
	closeGrace   = time.Second
)

// Close closes the connection: the AMQP close handshake, bounded by
// closeTimeout (after a failure the broker may not answer at all), then the
// socket, so that Close ends the connection within about two seconds
// whatever the broker does (invariant 5, docs/architecture.md). The handshake
// alone cannot promise that: a publish blocked in a socket write (a broker
// that stopped reading, e.g. under a memory alarm) holds amqp091-go's
// channel and send locks, its shutdown waits for them before it closes the
// socket, and a connection already shutting down makes the handshake
// return at once without closing anything.
func (l *Link) Close() error {
	done := make(chan error, 1)
	go func() { done <- l.Conn.CloseDeadline(time.Now().Add(closeTimeout)) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(closeTimeout + closeGrace):
		err = fmt.Errorf("close broker connection: no answer within %s, socket closed", closeTimeout+closeGrace)
	}
	l.Abort()
	return err
}

// Abort closes the connection's socket now, without the AMQP close
// handshake. Every write blocked under amqp091-go's locks fails and
// releases them, its reader sees the socket closed and shuts the
// connection down (the close notifications fire, unconfirmed messages stay
// unconfirmed and are published again by the next session). Safe to call
// from any goroutine, more than once, and on a Link built without a socket.
func (l *Link) Abort() {
	if l.raw != nil {
		l.raw.Abort()
	}
}
