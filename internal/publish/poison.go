package publish

import (
	"encoding/json"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

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

// PoisonReason returns why ev cannot be published as a message, or "" if it can.
// Only properties of the event count; the broker's state never makes an
// event poison.
func PoisonReason(ev *wal.Event, maxMessageBytes int64) string {
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
func deadLetter(ev *wal.Event, reason string, maxMessageBytes int64) amqp.Publishing {
	body := ev.Payload
	if int64(len(body)) > maxMessageBytes {
		body = body[:maxMessageBytes]
	}
	headers := amqp.Table{
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
	return amqp.Publishing{
		Headers:      headers,
		ContentType:  "application/octet-stream",
		DeliveryMode: amqp.Persistent,
		MessageId:    id,
		Timestamp:    ev.CommitTime,
		Body:         body,
	}
}
