package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// ErrPoison marks an event that can never become a valid message, whatever
// the broker does: retrying it would stall the relay forever.
var ErrPoison = errors.New("poison event")

// PoisonPolicy says what to do with a poison event.
type PoisonPolicy int

// The poison policies.
const (
	// Park leaves the row unpublished with attempts+1 and last_error set,
	// publishes it to the dead-letter exchange when one is configured, and
	// moves on. The row stays visible in the unpublished backlog.
	Park PoisonPolicy = iota
	// Stop ends the relay with an error naming the event.
	Stop
)

// maxShortString is AMQP's limit for a short string: exchange names,
// routing keys, header table keys and every string property.
const maxShortString = 255

// HeaderError carries the reason on a dead-lettered event.
const HeaderError = "cdcrelay-error"

// HeaderID carries a dead-lettered event's id when it is too long for
// message_id.
const HeaderID = "cdcrelay-id"

// poisonReason returns why ev cannot be published as a message, or "" if it can.
// Only properties of the event count; the broker's state never makes an
// event poison.
func poisonReason(ev *wal.Event, maxMessageBytes int64) string {
	switch {
	case ev.Problem != "":
		return ev.Problem
	case len(ev.RoutingKey) > maxShortString:
		return fmt.Sprintf("routing key is %d bytes; AMQP allows %d", len(ev.RoutingKey), maxShortString)
	case len(ev.Exchange) > maxShortString:
		return fmt.Sprintf("exchange name is %d bytes; AMQP allows %d", len(ev.Exchange), maxShortString)
	case int64(len(ev.Payload)) > maxMessageBytes:
		return fmt.Sprintf("payload is %d bytes, above CDCRELAY_MAX_MESSAGE_BYTES (%d)", len(ev.Payload), maxMessageBytes)
	case len(ev.Payload) == 0 || (!ev.PayloadIsJSON && !json.Valid(ev.Payload)):
		return "payload is not valid JSON"
	}
	return ""
}

// deadLetter builds the message that carries a poison event to the
// dead-letter exchange: the raw payload (cut to the size limit) and the
// reason, with the same identity headers as a normal message.
func deadLetter(ev *wal.Event, reason string, maxMessageBytes int64) Message {
	body := ev.Payload
	if int64(len(body)) > maxMessageBytes {
		body = body[:maxMessageBytes]
	}
	headers := Headers{
		HeaderError:     reason,
		HeaderCommitLSN: ev.CommitLSN.String(),
		HeaderTxIndex:   int64(ev.Index),
	}
	if len(ev.RoutingKey) <= maxShortString {
		headers["cdcrelay-routing-key"] = ev.RoutingKey
	}
	// An id too long for message_id (a text id column) travels in full as
	// a header, a long string: the dead letter itself must be sendable.
	id := ev.ID
	if len(id) > maxShortString {
		headers[HeaderID] = id
		id = ""
	}
	return Message{
		Headers:     headers,
		ContentType: "application/octet-stream",
		ID:          id,
		Time:        ev.CommitTime,
		Body:        body,
	}
}

// poison applies the poison policy (decide, causeContent) to an event
// that can never be published. Only the event's own content leads here:
// transport failures never do, so they never count as attempts. A parked
// event with a dead-letter copy is handed to the Acker once the copy's
// fate is known (handleCopyConfirm), at once without one: the row is
// recorded whatever the broker does with the copy, which is only counted
// (invariant 3, docs/architecture.md), but a copy lost with its channel (a
// later message closed it) or a crash ends the session before the park, so
// the next session sends the copy again.
func (p *Publisher) poison(ctx context.Context, l sinkLane, ev *wal.Event, f inflight, reason string) (inflight, error) {
	p.Metrics.poison.Inc()
	act := p.fate(causeContent)
	if act == actStop {
		return f, poisonStop(ev.ID, reason)
	}
	p.Log.Error("parking poison event: left unpublished with last_error set", "event", logID(ev.ID), "reason", reason,
		"dead_letter_exchange", p.DeadLetterExchange)
	defer p.Carryover.unstall(f.at, p.Metrics)
	if act != actParkCopy {
		p.acks.Parked(f.ref(), reason)
		return f, nil
	}
	if p.Carryover.copyRefused(f.at) {
		p.Log.Warn("poison event not dead-lettered: the broker refused its copy in an earlier session", "event", logID(ev.ID))
		p.acks.Parked(f.ref(), reason)
		return f, nil
	}
	dc, key, err := p.sendCopy(ctx, l, ev, f, reason)
	if err != nil {
		return f, err
	}
	if dc == nil {
		p.acks.Parked(f.ref(), reason)
		return f, nil
	}
	p.Metrics.inFlight.Inc()
	f.dc, f.copyOf, f.exchange, f.key, f.rowExchange, f.parkReason = dc, true, p.DeadLetterExchange, key, false, reason
	return f, nil
}

// poisonStop is the error that stops the relay on a poison event (actStop).
func poisonStop(id, reason string) error {
	return fmt.Errorf("%w: event %s: %s (set CDCRELAY_POISON=park to park it and go on)", ErrPoison, logID(id), reason)
}

// sendCopy publishes ev's dead-letter copy; dc is nil when none can be
// sent.
func (p *Publisher) sendCopy(ctx context.Context, l sinkLane, ev *wal.Event, f inflight, reason string) (dc confirmation, key string, err error) {
	key = ev.RoutingKey
	if len(key) > maxShortString {
		key = ""
	}
	msg := deadLetter(ev, reason, p.copyLimit())
	if why := p.unsendable(p.DeadLetterExchange, key, &msg); why != "" {
		// Never expected (deadLetter builds a sendable message); parking
		// without the copy beats a restart loop.
		p.Log.Error("poison event not dead-lettered: its dead letter cannot be sent", "event", logID(ev.ID), "reason", why)
		return nil, key, nil
	}
	f.copyOf, f.exchange, f.key, f.rowExchange = true, p.DeadLetterExchange, key, false
	p.alone.set(l, f)
	dc, err = l.publish(ctx, p.DeadLetterExchange, key, &msg)
	if err != nil {
		return nil, key, fmt.Errorf("dead-letter event %s: %w", logID(ev.ID), err)
	}
	return dc, key, nil
}

// copyLimit is the largest body a dead-letter copy may carry: the relay's
// limit, or the broker's when it is known to be lower.
func (p *Publisher) copyLimit() int64 {
	if limit := p.Carryover.BrokerLimit(); limit > 0 && limit < p.MaxMessageBytes {
		return limit
	}
	return p.MaxMessageBytes
}
