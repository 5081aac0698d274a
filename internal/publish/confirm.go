package publish

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/semaphore"
)

// This file is the confirm side of the publisher: each lane's confirms in
// publish order, returns, nacks, timeouts, and the connection's closure and
// flow control.

// confirmLoop takes a lane's confirms in publish order. Acks arrive in any
// order, within a lane and across lanes; walking each FIFO in order hands
// the Acker (the janitor's session, which acks the watermark once the row
// is marked) every ack, and the watermark's contiguous-prefix rule does
// the rest. A basic.return is only noted when it arrives, and acted on at
// its message's turn: the events before it are acked first, so the next
// session does not publish them again.
//
// When the session ends under it (its context, or this lane's channel
// closing) the loop does not just return: handOver first gives the Acker
// the confirms already received, so that what the broker acknowledged
// before a failure is marked and not published again (invariant 11,
// docs/architecture.md).
func (p *Publisher) confirmLoop(ctx context.Context, l sinkLane, fifo <-chan inflight, slots *semaphore.Weighted, bytes Budget) error {
	// An Acker that waits (the janitor's session, for room among its
	// unwritten marks) must learn at once that the run is over, even while
	// this loop is blocked in one of its calls: otherwise a failed session
	// could wait for a database that does not answer (invariant 5).
	defer context.AfterFunc(ctx, p.ending)()
	for {
		select {
		case f, ok := <-fifo:
			if !ok {
				return nil
			}
			if err := p.wait(ctx, l, f); err != nil {
				if !interrupted(err) {
					return err
				}
				return p.handOver(ctx, l, fifo, &f, slots, bytes, err)
			}
			if err := p.handle(ctx, l, f); err != nil {
				return err
			}
			release(f, slots, bytes)
		case <-ctx.Done():
			return p.handOver(ctx, l, fifo, nil, slots, bytes, ctx.Err())
		}
	}
}

// release gives back what a handled message held: its bytes, its slot in
// the window, and its lane if it was alone in flight.
func release(f inflight, slots *semaphore.Weighted, bytes Budget) {
	bytes.Release(f.weight)
	slots.Release(1)
	if f.alone != nil {
		close(f.alone)
	}
}

// await waits for f's confirm and handles it: a parked event's dead-letter
// copy, awaited at its event's turn (parkLate).
func (p *Publisher) await(ctx context.Context, l sinkLane, f inflight) error {
	if err := p.wait(ctx, l, f); err != nil {
		return err
	}
	return p.handle(ctx, l, f)
}

// wait returns nil once f's confirmation is resolved (at once if f has
// none); else it leaves f untouched and says why: the confirm timeout or
// ctx's end (interrupted). A lane that closes resolves its confirmations
// as not acked, which handleConfirm reads as the closure (closedWhile).
// Returns are not read here: the lane keeps them until handle drains
// them, and it holds at most one per message in its window.
func (p *Publisher) wait(ctx context.Context, l sinkLane, f inflight) error {
	if f.resumed || f.dc == nil {
		return nil
	}
	// A confirmation already resolved wins over a context that ended at
	// the same time (select picks at random among ready cases).
	select {
	case <-f.dc.Done():
		return nil
	default:
	}
	timer := time.NewTimer(p.ConfirmTimeout)
	defer timer.Stop()
	for {
		select {
		case <-f.dc.Done():
			return nil
		case <-timer.C:
			// A blocked broker holds confirms back; that is flow control,
			// not a failure, so the clock restarts once it lets go.
			if p.blocked.Load() || time.Since(time.Unix(0, p.unblocked.Load())) < p.ConfirmTimeout {
				timer.Reset(p.ConfirmTimeout)
				continue
			}
			// causeTimeout: actRetry (decide).
			return fmt.Errorf("%w: event %s unconfirmed after %s", ErrConfirmTimeout, f.id, p.ConfirmTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// interrupted reports whether wait stopped because the session or the lane
// ended rather than because of its message: the confirms already received
// are then handed over (handOver).
func interrupted(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrClosed)
}

// handle hands the Acker the fate of f, whose confirmation (if it has one)
// is resolved.
func (p *Publisher) handle(ctx context.Context, l sinkLane, f inflight) error {
	switch {
	case f.resumed:
		p.Metrics.resumed.Inc()
		p.acks.Resumed(f.ref())
		p.Carryover.unstall(f.at, p.Metrics)
		return nil
	case f.dc == nil: // parked without a dead-letter copy: already handed over
		return nil
	}
	// A return for this message, if any, is readable before its
	// confirmation resolves (sinkLane): it is waiting on the lane now.
	err := p.drainReturns(l)
	p.Metrics.inFlight.Dec()
	if err != nil {
		return err
	}
	return p.handleConfirm(ctx, l, f)
}

// handOverWait bounds handOver's wait, after a failure, for confirmations
// still unresolved and for the FIFO to close: a lane still open (the
// failure was elsewhere) may yet be confirmed, and stuckGrace after the
// failure abortIfStuck closes the socket, which resolves the rest.
const handOverWait = time.Second

// handOver runs when a lane stops with messages still in its FIFO (f, if
// not nil, is the one it was waiting for): the session's context ended
// (another lane or the connection closed, the reader failed, a stop) or
// the lane's own channel closed. It hands the Acker, in publish order,
// every message whose confirmation is resolved as an ack, with the resumed
// and parked events among them, and stops at the first that is not: so the
// acks received before a failure are marked and become the next session's
// resume place instead of being published again (invariant 11,
// docs/architecture.md), and nothing after the first message the broker
// did not acknowledge is handed on (invariant 1).
//
// It relies on the lane's contract (sinkLane): once a lane is closed,
// every answer the broker sent before the close has resolved its
// confirmation, and the rest resolve as not acked. The AMQP sink has it
// from amqp091-go (v1.16.0): one reader goroutine per connection
// dispatches the frames in the order the broker sent them, a basic.ack
// resolves its DeferredConfirmation (confirms.One, Multiple) before the
// next frame is read, and a channel.close, or the connection's end, first
// marks the channel closed and reaches NotifyClose (how the session
// learns of it: watch, closeReason), then resolves every confirmation
// still outstanding as not acked (closeResources, confirms.Close). So by
// the time a close ends the session, every ack the broker sent before it
// is resolved, and the rest resolve at once as nacks. The broker does not send, once it closes a
// channel, the confirms it still owed for messages it took (RabbitMQ
// 3.10): drainFor keeps those out of the way of a missing exchange.
//
// It never publishes (it stops at a returned message, whose dead-letter
// copy the next session sends) and it is bounded (invariant 5,
// docs/architecture.md): after a failure it waits at most handOverWait;
// after a stop (context.Canceled: the caller's deadline) it takes only
// what is resolved already.
func (p *Publisher) handOver(ctx context.Context, l sinkLane, fifo <-chan inflight, f *inflight, slots *semaphore.Weighted, bytes Budget, cause error) error {
	p.ending()
	wait := handOverWait
	if errors.Is(context.Cause(ctx), context.Canceled) {
		wait = 0
	}
	by, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait)
	defer cancel()
	for {
		var next inflight
		if f != nil {
			next, f = *f, nil
		} else {
			var ok bool
			if next, ok = receive(fifo, by.Done()); !ok {
				return cause // every message handed over, or the time is up
			}
		}
		if !p.resolved(next, by.Done()) {
			return cause
		}
		// A return the relay cannot place stops the hand-over: it might be
		// one of the messages about to be handed on.
		if err := p.drainReturns(l); err != nil {
			p.Log.Warn("a returned message the relay cannot place ends the hand-over of confirms", "error", err)
			return cause
		}
		// A returned message is left to the next session: parking it may
		// mean publishing its dead-letter copy (parkLate).
		if next.dc != nil {
			if _, returned := p.takeReturn(l, next); returned {
				return cause
			}
		}
		if err := p.handle(ctx, l, next); err != nil {
			return err // not acked: nothing after it is handed on
		}
		release(next, slots, bytes)
	}
}

// receive takes fifo's next message: at once if one is there, else by
// deadline. ok is false once fifo is closed or the deadline has passed.
func receive(fifo <-chan inflight, deadline <-chan struct{}) (f inflight, ok bool) {
	select {
	case f, ok = <-fifo:
		return f, ok
	default:
	}
	select {
	case f, ok = <-fifo:
		return f, ok
	case <-deadline:
		return inflight{}, false
	}
}

// resolved reports whether f's confirmation is resolved (or f needs none),
// waiting by deadline.
func (p *Publisher) resolved(f inflight, deadline <-chan struct{}) bool {
	if f.resumed || f.dc == nil {
		return true
	}
	// A confirmation already resolved wins over a deadline that passed at
	// the same time (select picks at random among ready cases).
	select {
	case <-f.dc.Done():
		return true
	default:
	}
	select {
	case <-f.dc.Done():
		return true
	case <-deadline:
		return false
	}
}

// ending tells the Acker that the run is over (Acker.Ending).
func (p *Publisher) ending() { p.acks.Ending() }

// maxSeen bounds exchangesSeen; forgetting costs one drain per exchange.
const maxSeen = 4096

// handleConfirm handles a message whose confirmation resolved.
func (p *Publisher) handleConfirm(ctx context.Context, l sinkLane, f inflight) error {
	ret, returned := p.takeReturn(l, f)
	if f.copyOf {
		return p.handleCopyConfirm(l, f, returned)
	}
	if !f.dc.Acked() {
		if l.isClosed() {
			return p.closedWhile(l, f)
		}
		p.Metrics.nacks.Inc() // causeNack: actRetry (decide)
		return fmt.Errorf("%w: event %s (a queue refused it: overflow reject-publish or an internal error)", ErrNacked, f.id)
	}
	if f.rowExchange { // acked, returned or not: the exchange exists (drainFor)
		p.seen.add(f.exchange)
	}
	if returned {
		return p.unroutable(ctx, l, f, ret)
	}
	p.acks.Ack(f.ref())
	p.Carryover.unstall(f.at, p.Metrics)
	now := time.Now()
	p.Metrics.lastConfirm.Set(float64(now.UnixNano()) / 1e9)
	p.Metrics.confirmLatency.Observe(now.Sub(f.sent).Seconds())
	if !f.commit.IsZero() {
		p.Metrics.commitToAck.Observe(now.Sub(f.commit).Seconds())
	}
	return nil
}

// handleCopyConfirm counts a dead-letter copy the broker did not take, and parks
// its row if that waited for the copy (parkReason): taken or not, the row
// is parked, so a refused copy never stalls anything (invariant 3, docs/architecture.md). Only a
// closed channel ends the session, before the park, as any closed channel
// does; a copy refused while it was alone in flight is not sent again.
func (p *Publisher) handleCopyConfirm(l sinkLane, f inflight, returned bool) error {
	var outcome string
	switch {
	case !f.dc.Acked() && l.isClosed():
		if e := l.closeReason(); e != nil && f.alone != nil {
			p.blame(l, e)
		}
		return fmt.Errorf("%w while the dead-letter copy of event %s was in flight", laneClosed(l), logID(f.id))
	case !f.dc.Acked():
		outcome = "nacked"
	case returned:
		outcome = "returned"
	default:
		p.parkAfterCopy(f)
		return nil
	}
	p.Metrics.deadLetter.WithLabelValues(outcome).Inc()
	p.Log.Error("a parked event's dead-letter copy was not taken by the broker; the row stays parked and the stream goes on",
		"event", logID(f.id), "outcome", outcome, "dead_letter_exchange", f.exchange, "routing_key", f.key,
		"remedy", "bind a queue to the dead-letter exchange for this routing key (or '#')")
	p.parkAfterCopy(f) // causeCopyNotTaken: actPark (decide)
	return nil
}

// parkAfterCopy parks the row of a dead-letter copy whose park waited for
// it.
func (p *Publisher) parkAfterCopy(f inflight) {
	if f.parkReason != "" {
		p.acks.Parked(f.ref(), f.parkReason)
	}
}

// watch turns connection and channel closure into errors and tracks flow
// control, until the confirm loops are done.
func (p *Publisher) watch(ctx context.Context, done <-chan struct{}) error {
	closed := make(chan error, len(p.sink.lanes()))
	for _, l := range p.sink.lanes() {
		go func() {
			select {
			case e, ok := <-l.closing():
				if ok && e != nil {
					p.blame(l, e) // the lane's confirm loop may never see it: this error ends the session first
				}
				closed <- closedError("channel", e, ok)
			case <-done:
			case <-ctx.Done():
			}
		}()
	}
	blocked := p.sink.flow()
	for {
		select {
		case e, ok := <-p.sink.connClosed(): // causeTransport: actRetry (decide)
			return closedError("connection", e, ok)
		case err := <-closed:
			return err
		case b, ok := <-blocked:
			if !ok { // closed with the connection, which connClosed reports
				blocked = nil
				continue
			}
			p.blocked.Store(b.Blocked)
			if p.OnBlocked != nil {
				p.OnBlocked(b.Blocked, b.Reason)
			}
			if b.Blocked {
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

// unblock forgets a block when the session ends: the connection that was
// blocked is gone, and the next one hears of an alarm afresh (a broker
// sends connection.blocked to a connection that publishes during one).
// Without it a session that ended while blocked would leave the gauge and
// /readyz saying blocked for good.
func (p *Publisher) unblock() {
	if !p.blocked.Swap(false) {
		return
	}
	p.Metrics.blocked.Set(0)
	if p.OnBlocked != nil {
		p.OnBlocked(false, "")
	}
}

// laneClosed is the error of a lane whose channel closed, with the
// broker's reason when it gave one.
func laneClosed(l sinkLane) error {
	e := l.closeReason()
	return closedError("channel", e, e != nil)
}

// closedError says that the channel or connection closed and, when the
// broker closed it, why. A missing exchange is a publish to an exchange
// that does not exist (deleted while the relay ran, or named by a row's
// exchange column): the broker's reason names the exchange, and the error
// adds the remedy. The error is ErrClosed and, through errors.As, the
// broker's own error (an *amqp.Error).
func closedError(what string, e *closure, ok bool) error {
	if !ok || e == nil {
		return fmt.Errorf("%w: %s closed", ErrClosed, what)
	}
	// The reason may quote a whole over-long value (a frame error).
	msg := fmt.Sprintf("%v: %s closed by the broker: %d %s", ErrClosed, what, e.code, clipText(e.reason))
	if e.kind == closeNoExchange {
		msg += ": the exchange does not exist (deleted?): declare it (the relay does not declare topology), or fix CDCRELAY_EXCHANGE or the row's exchange column (CDCRELAY_EXCHANGE_COLUMN)"
	}
	return &brokerClosed{msg: msg, reason: e.err, channel: what == "channel"}
}

// brokerClosed is a channel or connection the broker closed, with its
// reason.
type brokerClosed struct {
	msg     string
	reason  error
	channel bool // a channel, not the whole connection: the broker refused something on it
}

func (b *brokerClosed) Error() string   { return b.msg }
func (b *brokerClosed) Unwrap() []error { return []error{ErrClosed, b.reason} }
