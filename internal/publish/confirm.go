package publish

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sync/semaphore"
)

// This file is the confirm side of the publisher: each lane's confirms in
// publish order, returns, nacks, timeouts, and the connection's closure and
// flow control.

// confirmLoop takes a lane's confirms in publish order. Acks arrive in any
// order, within a lane and across lanes; walking each FIFO in order hands
// the Acker (the janitor's session, which acks the watermark once the row
// is marked) every ack, and the watermark's contiguous-prefix rule does
// the rest. A
// basic.return is only noted when it arrives, and acted on at its
// message's turn: the events before it are acked first, so the next
// session does not publish them again.
func (p *Publisher) confirmLoop(ctx context.Context, l *lane, fifo <-chan inflight, slots *semaphore.Weighted, bytes Budget) error {
	for {
		select {
		case f, ok := <-fifo:
			if !ok {
				return nil
			}
			if err := p.await(ctx, l, f); err != nil {
				return err
			}
			bytes.Release(f.weight)
			slots.Release(1)
			if f.alone != nil {
				close(f.alone)
			}
		case r, ok := <-l.returns:
			if err := p.noteReturn(l, r, ok); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (p *Publisher) await(ctx context.Context, l *lane, f inflight) error {
	switch {
	case f.resumed:
		p.Metrics.resumed.Inc()
		p.acks.Resumed(f.ref())
		p.Resume.unstall(f.at, p.Metrics)
		return nil
	case f.dc == nil: // parked without a dead-letter copy: already handed over
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
			p.drainReturns(l)
			p.Metrics.inFlight.Dec()
			return p.settle(ctx, l, f)
		case r, ok := <-l.returns:
			if err := p.noteReturn(l, r, ok); err != nil {
				return err
			}
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

// settle handles a message whose confirmation resolved.
func (p *Publisher) settle(ctx context.Context, l *lane, f inflight) error {
	ret, returned := p.takeReturn(l, f)
	if f.copyOf {
		return p.settleCopy(l, f, returned)
	}
	if !f.dc.Acked() {
		if l.ch.IsClosed() {
			return p.closedWhile(l, f)
		}
		p.Metrics.nacks.Inc()
		return fmt.Errorf("%w: event %s (a queue refused it: overflow reject-publish or an internal error)", ErrNacked, f.id)
	}
	if returned {
		return p.unroutable(ctx, l, f, ret)
	}
	p.acks.Ack(f.ref())
	p.Resume.unstall(f.at, p.Metrics)
	now := time.Now()
	p.Metrics.lastConfirm.Set(float64(now.UnixNano()) / 1e9)
	p.Metrics.confirmLatency.Observe(now.Sub(f.sent).Seconds())
	if !f.commit.IsZero() {
		p.Metrics.commitToAck.Observe(now.Sub(f.commit).Seconds())
	}
	return nil
}

// settleCopy counts a dead-letter copy the broker did not take, and parks
// its row if that waited for the copy (parkReason): taken or not, the row
// is parked, so a refused copy never stalls anything (invariant 3, docs/architecture.md). Only a
// closed channel ends the session, before the park, as any closed channel
// does; a copy refused while it was alone in flight is not sent again.
func (p *Publisher) settleCopy(l *lane, f inflight, returned bool) error {
	var outcome string
	switch {
	case !f.dc.Acked() && l.ch.IsClosed():
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
	p.parkAfterCopy(f)
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
	closed := make(chan error, len(p.link.lanes))
	for _, l := range p.link.lanes {
		go func() {
			select {
			case e, ok := <-l.closed:
				if ok && e != nil {
					p.blame(l, e) // the lane's confirm loop may never see it: this error ends the session first
				}
				closed <- closedError("channel", e, ok)
			case <-done:
			case <-ctx.Done():
			}
		}()
	}
	blocked := p.link.blocked
	for {
		select {
		case e, ok := <-p.link.connClosed:
			return closedError("connection", e, ok)
		case err := <-closed:
			return err
		case b, ok := <-blocked:
			if !ok { // closed with the connection, which connClosed reports
				blocked = nil
				continue
			}
			p.blocked.Store(b.Active)
			if p.OnBlocked != nil {
				p.OnBlocked(b.Active, b.Reason)
			}
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
func laneClosed(l *lane) error {
	e := l.closeReason()
	return closedError("channel", e, e != nil)
}

// closedError says that the channel or connection closed and, when the
// broker closed it, why. A 404 is a publish to an exchange that does not
// exist (deleted while the relay ran, or named by a row's exchange
// column): the broker's reason names the exchange, and the error adds the
// remedy. The error is ErrClosed and, through errors.As, the *amqp.Error.
func closedError(what string, e *amqp.Error, ok bool) error {
	if !ok || e == nil {
		return fmt.Errorf("%w: %s closed", ErrClosed, what)
	}
	// The reason may quote a whole over-long value (a frame error).
	msg := fmt.Sprintf("%v: %s closed by the broker: %d %s", ErrClosed, what, e.Code, clipText(e.Reason))
	if e.Code == amqp.NotFound {
		msg += ": the exchange does not exist (deleted?): declare it (the relay does not declare topology), or fix CDCRELAY_EXCHANGE or the row's exchange column (CDCRELAY_EXCHANGE_COLUMN)"
	}
	return &brokerClosed{msg: msg, reason: e, channel: what == "channel"}
}

// brokerClosed is a channel or connection the broker closed, with its
// reason.
type brokerClosed struct {
	msg     string
	reason  *amqp.Error
	channel bool // a channel, not the whole connection: the broker refused something on it
}

func (b *brokerClosed) Error() string   { return b.msg }
func (b *brokerClosed) Unwrap() []error { return []error{ErrClosed, b.reason} }
