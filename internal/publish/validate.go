package publish

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

// frameOverhead is what a frame adds to its payload: type, channel, size
// and the frame-end octet. amqp091-go chunks bodies by frame size minus
// this, and RabbitMQ closes the connection on a frame above its frame_max.
const frameOverhead = 8

// contentHeaderFixed is the content header frame's fixed part: class id,
// weight, body size and property flags.
const contentHeaderFixed = 2 + 2 + 8 + 2

// unsendableReason returns why msg, published to exchange with routing key key,
// can never be sent, or "" when it can. It walks the message exactly as
// amqp091-go's encoder does (write.go: basicPublish, headerFrame.write,
// writeTable, writeField): the exchange and routing key, every short string
// property, header table keys at any depth, the value types a table may
// hold, and the size of the content header frame against the negotiated
// frame size (frameMax; 0 when none was negotiated). A message it accepts
// encodes without error, so a failed publish of it is the transport's
// fault, never the row's.
func unsendableReason(exchange, key string, msg *amqp.Publishing, frameMax int) string {
	for _, s := range []struct{ name, value string }{
		{"exchange name", exchange}, {"routing key", key},
		{"content_type", msg.ContentType}, {"content_encoding", msg.ContentEncoding},
		{"correlation_id", msg.CorrelationId}, {"reply_to", msg.ReplyTo},
		{"expiration", msg.Expiration}, {"message_id", msg.MessageId},
		{"type", msg.Type}, {"user_id", msg.UserId}, {"app_id", msg.AppId},
	} {
		if len(s.value) > maxShortString {
			return fmt.Sprintf("%s is %d bytes; AMQP allows %d: %q", s.name, len(s.value), maxShortString, clip(s.value))
		}
	}
	size := contentHeaderFixed + propertiesSize(msg)
	if len(msg.Headers) > 0 {
		n, bad := tableSize(msg.Headers)
		if bad != nil {
			return bad.reason("headers")
		}
		if why := brokerHeaderRules(msg.Headers); why != "" {
			return why
		}
		size += 4 + n
	}
	if frameMax > 0 && size > frameMax-frameOverhead {
		return fmt.Sprintf("message properties (headers included) encode to %d bytes, above the broker's frame size of %d", size, frameMax)
	}
	if size > 1<<32-1 {
		return fmt.Sprintf("message properties (headers included) encode to %d bytes, above AMQP's 4 GiB frame limit", size)
	}
	return ""
}

// brokerHeaderRules returns why RabbitMQ would refuse these headers, or "".
// The broker reads CC and BCC as extra routing keys (sender-selected
// distribution) and closes the channel (406, unacceptable_type_in_header)
// when either is anything but an array of strings. A rule the broker
// enforces and this function does not know is still caught at run time:
// the refusal closes the channel, the next session publishes one message
// at a time and the refused one becomes poison (returns.go, closedWhile).
func brokerHeaderRules(h amqp.Table) string {
	for _, name := range []string{"CC", "BCC"} {
		v, ok := h[name]
		if !ok {
			continue
		}
		list, ok := v.([]any)
		if !ok {
			return fmt.Sprintf("header %s is %s; RabbitMQ accepts only an array of strings there (sender-selected routing keys)", name, amqpTypeName(v))
		}
		for i, e := range list {
			if _, ok := e.(string); !ok {
				return fmt.Sprintf("header %s[%d] is %s; RabbitMQ accepts only strings in %s (sender-selected routing keys)", name, i, amqpTypeName(e), name)
			}
		}
	}
	return ""
}

// amqpTypeName names a header value's type for an operator.
func amqpTypeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case amqp.Table:
		return "an object"
	case []any:
		return "an array"
	case float32, float64, int, int8, int16, int32, int64, uint8, uint16, uint32, uint64, amqp.Decimal:
		return "a number"
	default:
		return fmt.Sprintf("of type %T", v)
	}
}

// propertiesSize is the encoded size of every property but the headers:
// what headerFrame.write puts after the property flags.
func propertiesSize(msg *amqp.Publishing) int {
	n := 0
	for _, s := range []string{msg.ContentType, msg.ContentEncoding, msg.CorrelationId, msg.ReplyTo,
		msg.Expiration, msg.MessageId, msg.Type, msg.UserId, msg.AppId} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	if msg.DeliveryMode > 0 {
		n++
	}
	if msg.Priority > 0 {
		n++
	}
	if !msg.Timestamp.IsZero() {
		n += 8
	}
	return n
}

// unsendable is why a header value cannot be encoded. Its path is built
// only on failure, while the recursion unwinds, so the walk every message
// takes allocates nothing.
type unsendable struct {
	path string // from the table the check started at: ["key"][2]...
	why  string // a format with one %s, for the whole path
}

func (u *unsendable) under(step string) *unsendable {
	u.path = step + u.path
	return u
}

func (u *unsendable) reason(root string) string { return fmt.Sprintf(u.why, root+u.path) }

func keyStep(k string) string { return "[" + fmt.Sprintf("%q", clip(k)) + "]" }

// tableSize is the encoded size of a table's entries (writeTable, without
// its 4-byte length), or why it cannot be encoded.
func tableSize(t amqp.Table) (int, *unsendable) {
	n := 0
	for k, v := range t {
		if len(k) > maxShortString {
			return 0, &unsendable{path: keyStep(k), why: fmt.Sprintf("header key %%s is %d bytes; AMQP allows %d", len(k), maxShortString)}
		}
		f, bad := fieldSize(v)
		if bad != nil {
			return 0, bad.under(keyStep(k))
		}
		n += 1 + len(k) + f
	}
	return n, nil
}

// fieldSize is the encoded size of one table or array value, type octet
// included (writeField), or why amqp091-go refuses it.
func fieldSize(v any) (int, *unsendable) {
	switch x := v.(type) {
	case nil:
		return 1, nil
	case bool, byte, int8:
		return 2, nil
	case int16, uint16:
		return 3, nil
	case int, int32, uint32, float32:
		return 5, nil
	case int64, float64, time.Time:
		return 9, nil
	case amqp.Decimal:
		return 6, nil
	case string:
		return 5 + len(x), nil
	case []byte:
		return 5 + len(x), nil
	case []any:
		n := 5
		for i, e := range x {
			f, bad := fieldSize(e)
			if bad != nil {
				return 0, bad.under(fmt.Sprintf("[%d]", i))
			}
			n += f
		}
		return n, nil
	case amqp.Table:
		n, bad := tableSize(x)
		return 1 + 4 + n, bad
	default:
		return 0, &unsendable{why: fmt.Sprintf("header %%s has type %T, which AMQP tables cannot carry", v)}
	}
}

// clipAt is how much of an over-long value logs and last_error show.
const clipAt = 64

// clip shortens s for logs and reasons: the first 64 bytes (cut on a
// character boundary) and the full size, so one oversize value cannot
// flood the logs or last_error.
func clip(s string) string {
	if len(s) <= clipAt {
		return s
	}
	cut := clipAt
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:cut], len(s))
}

// logID is an event id as logs and errors show it: whole when it fits
// AMQP's message_id, clipped when it is over-long (and so poison).
func logID(id string) string {
	if len(id) <= maxShortString {
		return id
	}
	return clip(id)
}

// clipText bounds a free-form text that may quote a value, such as an
// error from the client library, which quotes the whole over-long string.
func clipText(s string) string {
	const maxText = 4 * clipAt
	if len(s) <= maxText {
		return s
	}
	cut := maxText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:cut], len(s))
}

// EncodeError is a publish that the client library refused while encoding
// the message, not while sending it: the event's own content is at fault.
// amqp091-go may have buffered the basic.publish method frame before its
// content header failed to encode, and it shuts the connection down after
// any frame error, so the session must end; the relay parks the event
// (ID, CommitLSN, Index) before publishing it in the next session.
type EncodeError struct {
	ID     string
	Reason string // clipped
}

func (e *EncodeError) Error() string {
	return fmt.Sprintf("publish event %s: the client library could not encode it: %s", logID(e.ID), e.Reason)
}

// transport reports whether err from a publish came from the connection
// (closed, reset, timed out, cancelled) rather than from encoding. Every
// error that touched the socket carries one of these; the encoder's own
// errors are plain text (amqp091-go's writeShortstr, Table.Validate,
// writeTable) or its syntax and field-type errors. A transport failure
// must never make a row poison (invariant 3, docs/architecture.md), so only
// errors positively free of these count as encoding errors.
func transport(err error) bool {
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) {
		return amqpErr != amqp.ErrSyntax && amqpErr != amqp.ErrFieldType
	}
	var netErr net.Error
	var errno syscall.Errno
	var alert tls.AlertError
	var record tls.RecordHeaderError
	if errors.As(err, &netErr) || errors.As(err, &errno) || errors.As(err, &alert) || errors.As(err, &record) {
		return true
	}
	for _, e := range []error{context.Canceled, context.DeadlineExceeded, io.EOF, io.ErrUnexpectedEOF,
		io.ErrShortWrite, io.ErrClosedPipe, net.ErrClosed} {
		if errors.Is(err, e) {
			return true
		}
	}
	// crypto/tls and bufio may report a dead connection as plain text.
	return strings.Contains(err.Error(), "use of closed network connection") ||
		strings.Contains(err.Error(), "broken pipe") || strings.Contains(err.Error(), "connection reset")
}
