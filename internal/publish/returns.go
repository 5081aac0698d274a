package publish

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pglogrepl"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// This file is what the publisher does when the broker says no to one
// message: a basic.return (unroutable), a channel it closes for one
// message's content or for a missing exchange. Which message the broker
// refused decides whether the row is at fault (poison, or the unroutable
// policy) or the broker is (retry): a return names its message; a closed
// channel does only while one message is in flight (Carryover's careful mode).

// returnKey is a returned message: its lane, its event's place (from the
// identity headers every message carries), and whether it was a
// dead-letter copy.
type returnKey struct {
	l    sinkLane
	at   wal.Place
	copy bool
}

// returnBook holds returns until their message's confirm comes up in the
// lane's order. The broker's return of a message is readable before its
// confirmation resolves (sinkLane), so a confirm never finds its return
// missing from here once the lane's returns are drained (drainReturns).
type returnBook struct {
	mu sync.Mutex
	m  map[returnKey]Returned
}

// noteReturn files a return taken from l. One the relay cannot place
// (it carries no identity headers, so this relay's build never sent it)
// is an error: it might be any of the messages in flight.
func (p *Publisher) noteReturn(l sinkLane, r Returned) error {
	p.Metrics.returns.Inc()
	key, placed := returnKeyOf(l, r)
	if !placed {
		return fmt.Errorf("%w: message %q to exchange %q with routing key %q: %d %s", ErrReturned,
			clip(r.MessageID), r.Exchange, r.RoutingKey, r.Code, r.Reason)
	}
	p.returns.mu.Lock()
	defer p.returns.mu.Unlock()
	if p.returns.m == nil {
		p.returns.m = make(map[returnKey]Returned)
	}
	p.returns.m[key] = r
	return nil
}

// drainReturns files every return l holds now. It is called once a
// confirmation resolved and before its return is looked up: that is when
// the lane's contract promises the return is there. It files them all and
// reports the first it could not place.
func (p *Publisher) drainReturns(l sinkLane) error {
	var first error
	for {
		r, ok := l.nextReturn()
		if !ok {
			return first
		}
		if err := p.noteReturn(l, r); err != nil && first == nil {
			first = err
		}
	}
}

// takeReturn removes and returns f's return, if the broker returned it.
func (p *Publisher) takeReturn(l sinkLane, f inflight) (Returned, bool) {
	p.returns.mu.Lock()
	defer p.returns.mu.Unlock()
	key := returnKey{l: l, at: f.at, copy: f.copyOf}
	r, ok := p.returns.m[key]
	if ok {
		delete(p.returns.m, key)
	}
	return r, ok
}

// returnKeyOf places a returned message by the identity headers the relay
// puts on every message and dead-letter copy.
func returnKeyOf(l sinkLane, r Returned) (returnKey, bool) {
	text, ok := r.Headers[HeaderCommitLSN].(string)
	if !ok {
		return returnKey{}, false
	}
	lsn, err := pglogrepl.ParseLSN(text)
	if err != nil {
		return returnKey{}, false
	}
	index, ok := r.Headers[HeaderTxIndex].(int64)
	if !ok {
		return returnKey{}, false
	}
	_, copied := r.Headers[HeaderError]
	return returnKey{l: l, at: wal.Place{CommitLSN: lsn, Index: int(index)}, copy: copied}, true
}

// unroutable handles an event the broker returned, at its turn: with
// CDCRELAY_UNROUTABLE=park it is poison; with stall the session ends on it,
// after every event before it was acked, and the row is named wherever an
// operator looks (log, /readyz through the error, cdcrelay_stalled_event_info).
func (p *Publisher) unroutable(ctx context.Context, l sinkLane, f inflight, r Returned) error {
	if act := p.fate(causeUnroutable); act != actStall {
		reason := fmt.Sprintf("unroutable: the broker returned it from exchange %q with routing key %q (%d %s)",
			r.Exchange, r.RoutingKey, r.Code, r.Reason)
		return p.parkLate(ctx, l, f, reason, act)
	}
	p.Carryover.stall(Stall{ID: f.id, Exchange: r.Exchange, RoutingKey: r.RoutingKey, Cause: CauseNoRoute, At: f.at}, p.Metrics)
	return fmt.Errorf("%w: event %s to exchange %q with routing key %q: %d %s (bind a queue for this key, or set CDCRELAY_UNROUTABLE=park to park such rows)",
		ErrReturned, logID(f.id), r.Exchange, r.RoutingKey, r.Code, r.Reason)
}

// parkLate parks an event the broker refused after it was published: the
// poison policy applies as it does to an event that could not be built.
// The dead-letter copy is sent and awaited here, at the event's turn, and
// the row is parked only once the copy's fate is known: a copy lost with
// its channel (a later message closed it) ends the session before the
// park, so the next session handles the event, and sends its copy, again.
// A copy the broker returns or nacks is only counted. act is the event's
// fate (decide): actStop, actPark or actParkCopy.
func (p *Publisher) parkLate(ctx context.Context, l sinkLane, f inflight, reason string, act action) error {
	p.Metrics.poison.Inc()
	if act == actStop {
		return poisonStop(f.id, reason)
	}
	p.Log.Error("parking poison event: left unpublished with last_error set", "event", logID(f.id), "reason", reason,
		"dead_letter_exchange", p.DeadLetterExchange)
	defer p.Carryover.unstall(f.at, p.Metrics)
	if act != actParkCopy || f.ev == nil || p.Carryover.copyRefused(f.at) {
		p.acks.Parked(f.ref(), reason)
		return nil
	}
	dc, key, err := p.sendCopy(ctx, l, f.ev, f, reason)
	if err != nil {
		return err
	}
	if dc != nil {
		p.Metrics.inFlight.Inc()
		if err := p.await(ctx, l, inflight{dc: dc, seq: f.seq, id: f.id, at: f.at, xid: f.xid, copyOf: true,
			exchange: p.DeadLetterExchange, key: key, alone: f.alone, sent: f.sent}); err != nil {
			return err
		}
	}
	p.acks.Parked(f.ref(), reason)
	return nil
}

// closedWhile is the error of a lane whose channel closed while f was in
// flight; blame says whose fault it was, if f was alone (else causeClosed:
// actRetry, decide).
func (p *Publisher) closedWhile(l sinkLane, f inflight) error {
	err := fmt.Errorf("%w while event %s was in flight", laneClosed(l), logID(f.id))
	if e := l.closeReason(); e != nil && f.alone != nil {
		p.blame(l, e)
	}
	return err
}

// aloneBook holds, per lane, the message in flight alone (careful mode),
// so that whichever goroutine first learns that the broker closed the
// channel (the lane's confirm loop, or the publisher's watch) can blame it.
type aloneBook struct {
	mu sync.Mutex
	m  map[sinkLane]*aloneEntry
}

type aloneEntry struct {
	f      inflight
	blamed bool
}

// set records f as l's message in flight alone, if it is one.
func (b *aloneBook) set(l sinkLane, f inflight) {
	if f.alone == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = make(map[sinkLane]*aloneEntry)
	}
	b.m[l] = &aloneEntry{f: f}
}

// clear forgets l's message in flight alone: its confirm was handled.
func (b *aloneBook) clear(l sinkLane) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, l)
}

// take returns l's message in flight alone, once.
func (b *aloneBook) take(l sinkLane) (inflight, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.m[l]
	if e == nil || e.blamed {
		return inflight{}, false
	}
	e.blamed = true
	return e.f, true
}

// blame handles the broker closing l's channel with reason e while one
// message was in flight alone: the reason (classified by the sink:
// closure) is about that message. A refusal (AMQP's 406
// PRECONDITION_FAILED) is its own content (a header the broker rejects, a
// body above its max_message_size): it is remembered as refused and the
// next session parks it (poison). A missing exchange (AMQP's 404) named
// by its row is its routing (CDCRELAY_UNROUTABLE). A dead-letter copy refused so is
// not sent again. With several in flight the culprit is unknown: the next
// session publishes them one at a time and finds it (Carryover). The fate is
// decide's (blamed names the cause).
func (p *Publisher) blame(l sinkLane, e *closure) {
	if e.kind == closeOther {
		return // the broker's own trouble (an internal error, a node going down): a transport failure
	}
	// The broker's limit is a fact whichever message hit it.
	if e.limit > 0 {
		p.Carryover.learnLimit(e.limit, p.Metrics)
	}
	f, ok := p.alone.take(l)
	if !ok {
		return
	}
	c := blamed(e, f)
	switch p.fate(c) {
	case actRemember:
		p.remember(f, c, e)
	case actStall:
		p.Carryover.stall(Stall{ID: f.id, Exchange: f.exchange, RoutingKey: f.key, Cause: CauseNoExchange, At: f.at}, p.Metrics)
		p.Log.Error("stalled: an event names an exchange that does not exist (CDCRELAY_UNROUTABLE=stall)",
			"event", logID(f.id), "exchange", f.exchange, "routing_key", f.key,
			"remedy", "declare the exchange, or set CDCRELAY_UNROUTABLE=park to park such rows")
	default: // actRetry: the session ends as any closed channel does
	}
}

// blamed classifies the broker closing the channel with e (a refusal or
// a missing exchange) while f was alone in flight.
func blamed(e *closure, f inflight) cause {
	switch {
	case f.copyOf:
		return causeCopyRefused
	case e.kind == closeRefused:
		return causeBrokerRefused
	case e.kind == closeNoExchange && f.rowExchange:
		return causeNoExchange
	}
	return causeClosed // the configured exchange is missing: the operator's to fix
}

// remember records that the broker refused f alone (actRemember), so that
// the next session parks its row, or parks it without its copy, instead of
// sending it again.
func (p *Publisher) remember(f inflight, c cause, e *closure) {
	switch c {
	case causeCopyRefused:
		p.Carryover.refuseCopy(f.at)
		p.Metrics.deadLetter.WithLabelValues("refused").Inc()
		p.Log.Error("the broker refused a parked event's dead-letter copy; the row stays parked, and its copy is not sent again",
			"event", logID(f.id), "dead_letter_exchange", f.exchange, "reason", clipText(e.reason))
	case causeNoExchange:
		p.Refused.addAt(f.id, f.at, f.backfill, fmt.Sprintf("unroutable: the row's exchange %q does not exist", f.exchange))
		p.Log.Error("an event names an exchange that does not exist; the next session parks it (CDCRELAY_UNROUTABLE=park)",
			"event", logID(f.id), "exchange", f.exchange)
	default:
		reason := "the broker refused it: " + clipText(e.reason)
		p.Refused.addAt(f.id, f.at, f.backfill, reason)
		p.Log.Error("the broker refused an event for its content; the session ends and the next one handles it as poison (CDCRELAY_POISON)",
			"event", logID(f.id), "reason", reason)
	}
}

// Refusal reports whether err ended a session because the broker refused
// a message (a nack, a return, a channel it closed), not because of the
// transport: the next session then publishes those messages one at a time
// (Carryover.Failed).
func Refusal(err error) bool {
	if errors.Is(err, ErrNacked) || errors.Is(err, ErrReturned) {
		return true
	}
	var b *brokerClosed
	return errors.As(err, &b) && b.channel
}
