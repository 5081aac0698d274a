package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// Errors that end a session; the relay restarts both sides from the slot.
var (
	ErrNacked         = errors.New("broker nacked a message")
	ErrReturned       = errors.New("broker returned an unroutable message")
	ErrConfirmTimeout = errors.New("no broker confirm in time")
	ErrClosed         = errors.New("broker connection closed")
)

// Acker learns the fate of each event, in publish order: acknowledged by
// the broker, or parked as poison (and dead-lettered, if configured).
type Acker interface {
	Ack(seq uint64, id string)
	Parked(seq uint64, id, reason string)
}

// Publisher publishes events from In in order on the Link's confirm-mode
// channel, keeps at most MaxInFlight messages and MaxInFlightBytes bytes
// unconfirmed, and reports each confirm to Acks. A nack, a return, a
// confirm timeout or a closed connection ends Run with an error; nothing
// after the failure is acked, so the slot cannot move past it.
type Publisher struct {
	Link             *Link
	In               <-chan wal.Event
	Acks             Acker
	Exchange         string
	MaxInFlight      int
	MaxInFlightBytes int64
	ConfirmTimeout   time.Duration
	MaxMessageBytes  int64
	Poison           PoisonPolicy
	// DeadLetterExchange, if set, receives parked poison events.
	DeadLetterExchange string
	// Drained is closed once In is closed and every published message is
	// confirmed: the reader then sends its final status update.
	Drained chan<- struct{}
	Log     *slog.Logger
	Metrics *Metrics

	blocked   atomic.Bool
	unblocked atomic.Int64 // unix nanos of the last unblock
}

// inflight is a published message awaiting its confirm.
type inflight struct {
	dc     *amqp.DeferredConfirmation
	seq    uint64
	id     string
	weight int64
	sent   time.Time
	commit time.Time
	parked string // poison reason; dc is nil unless it was dead-lettered
}

// Run publishes until In is closed and drained, ctx ends or a failure.
func (p *Publisher) Run(ctx context.Context) error {
	// The FIFO holds published, unconfirmed messages in publish order; its
	// capacity bounds the count in flight and the semaphore bounds the bytes.
	fifo := make(chan inflight, max(p.MaxInFlight-1, 1))
	bytes := semaphore.NewWeighted(p.MaxInFlightBytes)
	done := make(chan struct{})
	// A failed session leaves its messages unconfirmed; they are not in
	// flight any more once it is gone.
	p.Metrics.inFlight.Set(0)
	defer p.Metrics.inFlight.Set(0)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return p.publishLoop(gctx, fifo, bytes) })
	g.Go(func() error {
		defer close(done)
		return p.confirmLoop(gctx, fifo, bytes)
	})
	g.Go(func() error { return p.watch(gctx, done) })
	return g.Wait()
}

func (p *Publisher) publishLoop(ctx context.Context, fifo chan<- inflight, bytes *semaphore.Weighted) error {
	defer close(fifo)
	for {
		var ev wal.Event
		var ok bool
		select {
		case ev, ok = <-p.In:
			if !ok {
				return nil
			}
		case <-ctx.Done():
			return ctx.Err()
		}
		// An event larger than the byte budget takes all of it and goes alone.
		weight := min(int64(ev.Size()), p.MaxInFlightBytes)
		if err := bytes.Acquire(ctx, weight); err != nil {
			return err
		}
		f, err := p.publish(ctx, &ev)
		if err != nil {
			return err
		}
		f.weight = weight
		select {
		case fifo <- f:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// publish sends one event, or handles it by the poison policy when it can
// never become a valid message.
func (p *Publisher) publish(ctx context.Context, ev *wal.Event) (inflight, error) {
	f := inflight{seq: ev.Seq, id: ev.ID, sent: time.Now(), commit: ev.CommitTime}
	reason := Check(ev, p.MaxMessageBytes)
	var msg amqp.Publishing
	if reason == "" {
		var err error
		if msg, err = Message(ev); err != nil {
			reason = err.Error()
		}
	}
	if reason != "" {
		return p.poison(ctx, ev, f, reason)
	}
	exchange := p.Exchange
	if ev.Exchange != "" {
		exchange = ev.Exchange
	}
	// mandatory: an unroutable message comes back as basic.return, which is
	// a failure, never a silent drop.
	dc, err := p.Link.Ch.PublishWithDeferredConfirmWithContext(ctx, exchange, ev.RoutingKey, true, false, msg)
	if err != nil {
		return f, fmt.Errorf("publish event %s: %w", ev.ID, err)
	}
	p.Metrics.published.Inc()
	p.Metrics.bytes.Add(float64(len(msg.Body)))
	p.Metrics.inFlight.Inc()
	f.dc = dc
	return f, nil
}

// poison applies the policy to an event that can never be published. Only
// the event's own content leads here: transport failures never do, so they
// never count as attempts.
func (p *Publisher) poison(ctx context.Context, ev *wal.Event, f inflight, reason string) (inflight, error) {
	p.Metrics.poison.Inc()
	if p.Poison == Stop {
		return f, fmt.Errorf("%w: event %s: %s (set CDCRELAY_POISON=park to park it and go on)", ErrPoison, ev.ID, reason)
	}
	p.Log.Error("parking poison event: left unpublished with last_error set", "event", ev.ID, "reason", reason,
		"dead_letter_exchange", p.DeadLetterExchange)
	f.parked = reason
	if p.DeadLetterExchange == "" {
		return f, nil
	}
	key := ev.RoutingKey
	if len(key) > maxShortString {
		key = ""
	}
	dc, err := p.Link.Ch.PublishWithDeferredConfirmWithContext(ctx, p.DeadLetterExchange, key, true, false, deadLetter(ev, reason, p.MaxMessageBytes))
	if err != nil {
		return f, fmt.Errorf("dead-letter event %s: %w", ev.ID, err)
	}
	p.Metrics.inFlight.Inc()
	f.dc = dc
	return f, nil
}

// confirmLoop takes confirms in publish order. Acks arrive in any order;
// walking the FIFO in order and acking each one hands the watermark every
// ack, and its contiguous-prefix rule does the rest.
func (p *Publisher) confirmLoop(ctx context.Context, fifo <-chan inflight, bytes *semaphore.Weighted) error {
	for {
		select {
		case f, ok := <-fifo:
			if !ok {
				close(p.Drained)
				return nil
			}
			if err := p.await(ctx, f); err != nil {
				return err
			}
			bytes.Release(f.weight)
		case r := <-p.Link.returns:
			return p.returned(r)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (p *Publisher) await(ctx context.Context, f inflight) error {
	if f.dc == nil { // parked without a dead-letter exchange: nothing to confirm
		p.Acks.Parked(f.seq, f.id, f.parked)
		return nil
	}
	timer := time.NewTimer(p.ConfirmTimeout)
	defer timer.Stop()
	for {
		select {
		case <-f.dc.Done():
			// The broker sends basic.return before the ack of the same
			// message, and amqp091-go hands the return to our buffered
			// channel before it resolves the confirmation: so a return for
			// this message, if any, is already waiting here.
			select {
			case r := <-p.Link.returns:
				return p.returned(r)
			default:
			}
			p.Metrics.inFlight.Dec()
			if !f.dc.Acked() {
				if p.Link.Ch.IsClosed() {
					return fmt.Errorf("%w while event %s was in flight", ErrClosed, f.id)
				}
				p.Metrics.nacks.Inc()
				return fmt.Errorf("%w: event %s (a queue refused it: overflow reject-publish or an internal error)", ErrNacked, f.id)
			}
			if f.parked != "" {
				p.Acks.Parked(f.seq, f.id, f.parked)
				return nil
			}
			p.Acks.Ack(f.seq, f.id)
			now := time.Now()
			p.Metrics.confirmLatency.Observe(now.Sub(f.sent).Seconds())
			if !f.commit.IsZero() {
				p.Metrics.commitToAck.Observe(now.Sub(f.commit).Seconds())
			}
			return nil
		case r := <-p.Link.returns:
			return p.returned(r)
		case <-timer.C:
			// A blocked broker holds confirms back; that is flow control,
			// not a failure, so the clock restarts once it lets go.
			if p.blocked.Load() || time.Since(time.Unix(0, p.unblocked.Load())) < p.ConfirmTimeout {
				timer.Reset(p.ConfirmTimeout)
				continue
			}
			return fmt.Errorf("%w: event %s unconfirmed after %s", ErrConfirmTimeout, f.id, p.ConfirmTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (p *Publisher) returned(r amqp.Return) error {
	p.Metrics.returns.Inc()
	return fmt.Errorf("%w: event %s to exchange %q with routing key %q: %d %s (bind a queue for this key, or check the exchange)",
		ErrReturned, r.MessageId, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText)
}

// watch turns connection and channel closure into errors and tracks flow
// control, until the confirm loop is done.
func (p *Publisher) watch(ctx context.Context, done <-chan struct{}) error {
	for {
		select {
		case e, ok := <-p.Link.connClosed:
			return closedError("connection", e, ok)
		case e, ok := <-p.Link.chClosed:
			return closedError("channel", e, ok)
		case b := <-p.Link.blocked:
			p.blocked.Store(b.Active)
			if b.Active {
				p.Metrics.blocked.Set(1)
				p.Log.Warn("broker is blocking publishers (resource alarm); publishing paused", "reason", b.Reason)
			} else {
				p.Metrics.blocked.Set(0)
				p.unblocked.Store(time.Now().UnixNano())
				p.Log.Info("broker unblocked publishers")
			}
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func closedError(what string, e *amqp.Error, ok bool) error {
	if !ok || e == nil {
		return fmt.Errorf("%w: %s closed", ErrClosed, what)
	}
	return fmt.Errorf("%w: %s closed: %d %s", ErrClosed, what, e.Code, e.Reason)
}
