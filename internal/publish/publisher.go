package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/cdcrelay/cdcrelay/internal/failpoint"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// Errors that end a session; the relay restarts both sides from the slot.
var (
	ErrNacked         = errors.New("broker nacked a message")
	ErrReturned       = errors.New("broker returned an unroutable message")
	ErrConfirmTimeout = errors.New("no broker confirm in time")
	ErrClosed         = errors.New("broker connection closed")
)

// Acker learns the fate of each event: acknowledged by the broker, parked
// as poison (recorded before any dead-letter copy, whose fate never holds
// the event back), or resumed: acknowledged and marked in an earlier session
// (Carryover), so not published again. Its calls may wait (the janitor's
// session, for room among its unwritten marks); Ending, called from any
// goroutine and more than once, says the run is over: from then on a call
// waits no longer than a bound of the Acker's own (invariant 5,
// docs/architecture.md).
type Acker interface {
	Ack(ev Ref)
	Parked(ev Ref, reason string)
	Resumed(ev Ref)
	Ending()
}

// Ref names an event to its Acker: its sequence number in the session, its
// id, its place in the stream (for the next session's Carryover) and its
// transaction's id (for the janitor: a row not yet visible is not gone).
type Ref struct {
	Seq uint64
	ID  string
	At  wal.Place
	Xid uint32
}

// PublisherConfig is the publisher's configuration: the same for every
// session.
type PublisherConfig struct {
	Exchange         string
	MaxInFlight      int
	MaxInFlightBytes int64
	ConfirmTimeout   time.Duration
	MaxMessageBytes  int64
	Poison           PoisonPolicy
	// DeadLetterExchange, if set, receives a copy of each parked poison
	// event; a copy the broker does not take is counted and logged, never
	// retried (invariant 3, docs/architecture.md).
	DeadLetterExchange string
	// Unroutable says what a row the broker cannot route becomes: a stall
	// (the session ends and the row is published again, in order) or poison.
	Unroutable UnroutablePolicy
	// Timeline is the server's timeline at this session (IDENTIFY_SYSTEM),
	// sent on every message as cdcrelay-timeline so that pairs never go
	// back across a promotion (docs/messages.md); 0, unknown, sends none.
	Timeline uint32
	// Refused, if set, remembers across sessions the events the client
	// library refused to encode or the broker refused for their content,
	// and makes the publisher park them.
	Refused *Refusals
	// Carryover, if set, carries what earlier sessions learned: events done
	// before (skipped), where to publish one at a time, the broker's
	// message size limit, the row the stream is stalled on.
	Carryover *Carryover
	// OnBlocked, if set, hears when the broker starts and stops blocking
	// publishers (connection.blocked), with the broker's reason.
	OnBlocked func(active bool, reason string)
	Log       *slog.Logger // nil: discard
	Metrics   *Metrics     // nil: registered nowhere
}

// Publisher publishes events from its input on the Link's confirm-mode
// channels, keeps at most MaxInFlightBytes bytes unconfirmed and, on each
// channel (lane), at most max(MaxInFlight/channels, 1) messages: so at
// most MaxInFlight in all when there are no more channels than that, but
// one per channel, more than MaxInFlight, when MaxInFlight is below the
// number of channels (CDCRELAY_PUBLISH_CHANNELS). It reports each confirm
// to its Acker. With one channel (the default) every event goes out in
// commit order; with several, an event's channel is chosen by a hash of
// its routing key, so events with the same routing key keep their commit
// order and others may interleave. A nack, a return (unless its row is
// parked: decide), a confirm timeout or a closed connection ends Run with
// an error; nothing after the failure is acked, so the slot cannot move
// past it.
// One Publisher serves one session: Run is called once.
type Publisher struct {
	PublisherConfig
	sink sink
	in   <-chan wal.Event
	acks Acker
	// budget is the session's byte budget (MaxInFlightBytes), shared with
	// whoever feeds in: it took each event's weight (wal.Event.Weight)
	// before sending it, so the events waiting in in count too (invariant
	// 6, docs/architecture.md). The publisher gives the weight back once
	// the event's confirm or park is handled.
	budget Budget
	// drained is closed once in is closed and every published message is
	// confirmed (see Drained).
	drained chan struct{}

	blocked   atomic.Bool
	unblocked atomic.Int64 // unix nanos of the last unblock

	returns returnBook    // returned messages waiting for their confirm's turn
	alone   aloneBook     // each lane's message in flight alone, if any
	seen    exchangesSeen // row exchanges a confirm showed to exist (drainFor)

	lastMu  sync.Mutex
	last    wal.Place // the newest streamed event published (Last)
	lastSet bool
}

// ref names f's event to the Acker.
func (f *inflight) ref() Ref { return Ref{Seq: f.seq, ID: f.id, At: f.at, Xid: f.xid} }

// UnroutablePolicy is what a row the broker cannot route becomes.
type UnroutablePolicy int

// The unroutable policies.
const (
	// StallUnroutable ends the session on the row: it is published again,
	// first, by every next session until a binding (or its exchange)
	// exists; events after it wait, and keep their order.
	StallUnroutable UnroutablePolicy = iota
	// ParkUnroutable hands the row to the poison policy.
	ParkUnroutable
)

// Budget is the session's byte budget as the publisher sees it: the feeder
// of its input acquired each event's weight, the publisher releases it (a
// semaphore.Weighted, or the relay's, which also tells how much is taken).
type Budget interface {
	Release(n int64)
}

// newPublisher returns the publisher of one session on any sink (sink.go):
// it publishes the events of in and reports their fate to acks, releasing
// each event's weight, which the feeder of in acquired, into budget.
func newPublisher(s sink, in <-chan wal.Event, acks Acker, budget Budget, cfg PublisherConfig) *Publisher {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(prometheus.NewRegistry(), "")
	}
	return &Publisher{PublisherConfig: cfg, sink: s, in: in, acks: acks, budget: budget, drained: make(chan struct{})}
}

// Drained is closed once the input is closed and every published message
// is confirmed and handed to the Acker. The reader's final status update
// waits for more: for the rows of those acks to be marked too (the
// janitor session's Settled, which waits for Drained first). It is never
// closed when Run fails.
func (p *Publisher) Drained() <-chan struct{} { return p.drained }

// inflight is an event on its way through a lane's FIFO: a published
// message awaiting its confirm, a parked event's dead-letter copy, or an
// event that needs no confirm (parked without a copy, or resumed).
type inflight struct {
	dc       confirmation // nil: nothing to confirm
	seq      uint64
	id       string
	at       wal.Place
	xid      uint32
	weight   int64
	sent     time.Time
	commit   time.Time
	exchange string // where it went, for the errors that name it
	key      string
	// rowExchange: the exchange came from the row's exchange column, so a
	// missing exchange is the row's problem (CDCRELAY_UNROUTABLE).
	rowExchange bool
	// copyOf is set on a parked event's dead-letter copy: the copy's fate
	// is only counted.
	copyOf bool
	// parkReason, on a copy, is why its row is parked: handleCopyConfirm parks
	// the row once the copy's fate is known ("": parked already).
	parkReason string
	resumed    bool // done in an earlier session: not published
	backfill   bool // from a new slot's snapshot: its place is not stable across adoptions
	// ev is kept only when a return can make the event poison with a
	// dead-letter copy to send (parkLate); its bytes are in the budget
	// until the confirm is handled anyway.
	ev *wal.Event
	// alone, when set, is closed once this message's confirm is handled:
	// the lane publishes nothing else until then (Carryover, careful mode).
	alone chan struct{}
}

// Run publishes until the input is closed and drained, ctx ends or a failure.
func (p *Publisher) Run(ctx context.Context) error {
	lanes := p.sink.lanes()
	// Each lane's FIFO holds its published, unconfirmed messages in publish
	// order. A lane takes one of its window's slots before each publish and
	// gives it back once the confirm is handled, so a lane never has more
	// than window messages unconfirmed (a FIFO's capacity alone lets one
	// more through: the one its confirm loop awaits plus the one waiting to
	// enter the full FIFO). The byte budget, taken by the feeder of the
	// input and given back by the confirm loops, bounds the size across
	// all lanes.
	window := p.laneWindow()
	// A failed session leaves its messages unconfirmed; they are not in
	// flight any more once it is gone.
	p.Metrics.inFlight.Set(0)
	defer p.Metrics.inFlight.Set(0)
	defer p.unblock()

	g, gctx := errgroup.WithContext(ctx)
	defer abortIfStuck(gctx, p.sink.Abort)()
	inputs := p.spread(gctx, g, len(lanes))
	// Each confirm loop that ends cleanly (its input closed and every
	// message confirmed) reports here; a failing one cancels gctx instead.
	drainedLanes := make(chan struct{}, len(lanes))
	for i, l := range lanes {
		fifo := make(chan inflight, window)
		slots := semaphore.NewWeighted(int64(window))
		g.Go(func() error { return p.publishLoop(gctx, l, inputs[i], fifo, slots) })
		g.Go(func() error {
			if err := p.confirmLoop(gctx, l, fifo, slots, p.budget); err != nil {
				return err
			}
			drainedLanes <- struct{}{}
			return nil
		})
	}
	done := make(chan struct{})
	g.Go(func() error {
		defer close(done)
		for range lanes {
			select {
			case <-drainedLanes:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		close(p.drained)
		return nil
	})
	g.Go(func() error { return p.watch(gctx, done) })
	return g.Wait()
}

// spread returns one input per lane. With one lane it is the input itself; with
// more, a goroutine deals events out by a hash of the routing key, so one
// key always takes the same lane and keeps its order.
func (p *Publisher) spread(ctx context.Context, g *errgroup.Group, n int) []<-chan wal.Event {
	if n == 1 {
		return []<-chan wal.Event{p.in}
	}
	outs := make([]chan wal.Event, n)
	ins := make([]<-chan wal.Event, n)
	for i := range outs {
		outs[i] = make(chan wal.Event, 64)
		ins[i] = outs[i]
	}
	g.Go(func() error {
		defer func() {
			for _, o := range outs {
				close(o)
			}
		}()
		for {
			// Waiting for the input must watch ctx too: after a lane fails, Run
			// returns only once this goroutine does, and an idle outbox
			// may send nothing for hours.
			var ev wal.Event
			select {
			case e, ok := <-p.in:
				if !ok {
					return nil
				}
				ev = e
			case <-ctx.Done():
				return ctx.Err()
			}
			select {
			case outs[LaneOf(ev.RoutingKey, n)] <- ev:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})
	return ins
}

// LaneOf is the channel that carries events with this routing key when
// there are n channels (FNV-1a of the key).
func LaneOf(routingKey string, n int) int {
	h := uint32(2166136261)
	for i := 0; i < len(routingKey); i++ {
		h ^= uint32(routingKey[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}

func (p *Publisher) publishLoop(ctx context.Context, l sinkLane, in <-chan wal.Event, fifo chan<- inflight, slots *semaphore.Weighted) error {
	defer close(fifo)
	for {
		var ev wal.Event
		var ok bool
		select {
		case ev, ok = <-in:
			if !ok {
				return nil
			}
		case <-ctx.Done():
			return ctx.Err()
		}
		// The feeder of in took the event's weight (an event larger than
		// the byte budget takes all of it and goes alone).
		weight := ev.Weight(p.MaxInFlightBytes)
		if err := slots.Acquire(ctx, 1); err != nil {
			return err
		}
		v := p.Carryover.judge(&ev)
		// Above the broker's learned limit: sent alone, so that a refusal
		// names it and a broker that now accepts it (the limit was raised)
		// says so; never parked on the belief alone.
		above := (v == publishFast || v == publishAlone) && p.Carryover.aboveLimit(int64(len(ev.Payload)))
		// The first message to a row's exchange not seen to exist, and one
		// above the learned limit, go alone once the lane is drained
		// (drainFor, confirm.go).
		if v == publishFast || v == publishAlone {
			first, err := p.drainFor(ctx, &ev, slots, above)
			if err != nil {
				return err
			}
			if first {
				v = publishAlone
			}
		}
		var f inflight
		switch v {
		case skipDone:
			f = inflight{seq: ev.Seq, id: ev.ID, at: ev.Place(), xid: ev.Xid, resumed: true}
		case skipUnverified:
			p.Log.Warn("the stream does not hold the event an earlier session left off at; publishing everything again",
				"event", logID(ev.ID), "place", ev.Place())
			fallthrough
		default:
			var alone chan struct{}
			if v == publishAlone {
				alone = make(chan struct{})
			}
			var err error
			if f, err = p.publish(ctx, l, &ev, alone); err != nil {
				return err
			}
			// Kept only if a return would park it with a copy (parkLate).
			if f.dc != nil && !f.copyOf && p.fate(causeUnroutable) == actParkCopy {
				f.ev = &ev
			}
		}
		f.weight = weight
		if f.dc == nil {
			f.alone = nil // nothing in flight to wait for
		}
		select {
		case fifo <- f:
		case <-ctx.Done():
			return ctx.Err()
		}
		if f.alone != nil {
			select {
			case <-f.alone:
			case <-ctx.Done():
				return ctx.Err()
			}
			// Closed only once its confirm was handled without a failure.
			if above && f.dc != nil && p.Carryover.accepted(int64(len(ev.Payload)), p.Metrics) {
				p.Log.Info("the broker accepted a message above the max_message_size it refused before; forgetting that limit",
					"event", logID(ev.ID), "bytes", len(ev.Payload))
			}
		}
		if v == publishAlone {
			p.alone.clear(l)
		}
	}
}

// publish sends one event, or handles it by the poison policy when it can
// never become a valid message.
// alone, when not nil, makes it the lane's only message in flight (Carryover's
// careful mode): it is closed once the confirm is handled.
func (p *Publisher) publish(ctx context.Context, l sinkLane, ev *wal.Event, alone chan struct{}) (inflight, error) {
	f := inflight{seq: ev.Seq, id: ev.ID, at: ev.Place(), xid: ev.Xid, sent: time.Now(), commit: ev.CommitTime,
		exchange: p.Exchange, key: ev.RoutingKey, alone: alone, backfill: ev.Backfill}
	if ev.Backfill { // not a commit time: kept out of commit-to-ack
		f.commit = time.Time{}
	}
	if ev.Exchange != "" {
		f.exchange, f.rowExchange = ev.Exchange, true
	}
	msg, reason := p.build(ev, f.exchange)
	if reason != "" {
		return p.poison(ctx, l, ev, f, reason)
	}
	// mandatory: an unroutable message comes back as basic.return, which is
	// a failure, never a silent drop.
	p.alone.set(l, f) // before the send: the broker may close the channel at once
	dc, err := l.publish(ctx, f.exchange, ev.RoutingKey, &msg)
	if err != nil {
		if e := l.closeReason(); e != nil { // the broker closed the channel: say why
			return f, fmt.Errorf("publish event %s: %w", logID(ev.ID), closedError("channel", e, true))
		}
		return f, p.publishError(ev, err)
	}
	failpoint.Hit(failpoint.AfterPublish)
	if !ev.Backfill {
		p.noteLast(f.at)
	}
	p.Metrics.published.Inc()
	p.Metrics.bytes.Add(float64(len(msg.Body)))
	p.Metrics.inFlight.Inc()
	f.dc = dc
	return f, nil
}

// noteLast records the newest streamed event published (Last).
func (p *Publisher) noteLast(at wal.Place) {
	p.lastMu.Lock()
	defer p.lastMu.Unlock()
	if !p.lastSet || p.last.Before(at) {
		p.last, p.lastSet = at, true
	}
}

// Last is the place of the newest streamed event this publisher published;
// ok is false when it published none. After a failed Run, the next session
// publishes up to there one at a time (Carryover.Failed).
func (p *Publisher) Last() (at wal.Place, ok bool) {
	p.lastMu.Lock()
	defer p.lastMu.Unlock()
	return p.last, p.lastSet
}

// build makes ev's message, or says why it can never be sent: the sink
// takes the decision on the message as its client library will encode it
// (sink.unsendable), so that only a transport failure can make its
// publish fail.
func (p *Publisher) build(ev *wal.Event, exchange string) (Message, string) {
	if reason := p.Refused.reason(ev); reason != "" {
		return Message{}, reason
	}
	if reason := poisonReason(ev, p.MaxMessageBytes); reason != "" {
		return Message{}, reason
	}
	msg, err := MessageOn(ev, p.Timeline)
	if err != nil {
		return Message{}, clipText(err.Error())
	}
	why := p.unsendable(exchange, ev.RoutingKey, &msg) // first: the copy returned keeps Message.sinkHeaders
	return msg, why
}

// publishError classifies a failed publish. A transport failure ends the
// session and is retried from the slot. Anything else is the client
// library refusing to encode this event: the row's own content, which
// must not become a restart loop; it is remembered so that the next session
// parks it (the session still ends, since the library shuts the connection
// down after a frame error and may have sent part of the message): the
// fate table's causeTransport and causeEncode (decide).
func (p *Publisher) publishError(ev *wal.Event, err error) error {
	var own *unencodable
	if !errors.As(err, &own) {
		return fmt.Errorf("publish event %s: %w", logID(ev.ID), err)
	}
	reason := "the client library could not encode it: " + clipText(err.Error())
	p.Refused.add(ev, reason)
	p.Log.Error("the client library refused to encode an event; the session ends and the next one parks it",
		"event", logID(ev.ID), "reason", reason)
	return &EncodeError{ID: ev.ID, Reason: reason}
}

// unsendable is the sink's verdict on msg (sink.unsendable); a publisher
// without a sink (unit tests of build) has nobody to refuse it.
func (p *Publisher) unsendable(exchange, key string, msg *Message) string {
	if p.sink == nil {
		return ""
	}
	return p.sink.unsendable(exchange, key, msg)
}
