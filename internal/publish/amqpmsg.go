package publish

import (
	amqp "github.com/rabbitmq/amqp091-go"
)

// This file is the AMQP adapter's translation of the core's values
// (Message, Headers, Decimal, Returned) to amqp091-go's and back. Every
// message is persistent (sinkLane.publish); the other fields map to the
// AMQP property of the same meaning, as docs/messages.md lists them.

// publishing is msg as amqp091-go publishes it.
func publishing(msg *Message) amqp.Publishing {
	return amqp.Publishing{
		Headers:      amqpHeaders(msg),
		ContentType:  msg.ContentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    msg.ID,
		Timestamp:    msg.Time,
		Type:         msg.Type,
		Body:         msg.Body,
	}
}

// amqpHeaders is msg's headers as an AMQP table, converted on the first
// call and kept on the message for the next: Link.unsendable judges the
// table and lane.publish sends the same one, so headers that need a copy
// (amqpTable) are copied once per message. A map stored in an interface
// costs no allocation.
func amqpHeaders(msg *Message) amqp.Table {
	if t, ok := msg.sinkHeaders.(amqp.Table); ok {
		return t
	}
	t := amqpTable(msg.Headers)
	if t != nil {
		msg.sinkHeaders = t
	}
	return t
}

// amqpTable is h as an AMQP table. Most messages' headers hold only
// strings and integers, which amqp091-go takes as they are: then h is
// used without a copy, and only headers holding a Decimal, nested Headers
// or a list are copied with those converted.
func amqpTable(h Headers) amqp.Table {
	if h == nil {
		return nil
	}
	for _, v := range h {
		if needsConversion(v) {
			t := make(amqp.Table, len(h))
			for k, v := range h {
				t[k] = amqpValue(v)
			}
			return t
		}
	}
	return amqp.Table(h)
}

// needsConversion reports whether v is of a type amqp091-go knows by
// another name (Decimal, Headers) or may hold one ([]any).
func needsConversion(v any) bool {
	switch v.(type) {
	case Decimal, Headers, []any:
		return true
	}
	return false
}

// amqpValue is a header value as amqp091-go encodes it.
func amqpValue(v any) any {
	switch x := v.(type) {
	case Decimal:
		return amqp.Decimal{Scale: x.Scale, Value: x.Value}
	case Headers:
		return amqpTable(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = amqpValue(e)
		}
		return out
	default:
		return v
	}
}

// returnedOf is a basic.return as the core reads it.
func returnedOf(r amqp.Return) Returned {
	return Returned{
		Exchange:   r.Exchange,
		RoutingKey: r.RoutingKey,
		Code:       int(r.ReplyCode),
		Reason:     r.ReplyText,
		MessageID:  r.MessageId,
		Headers:    headersOf(r.Headers),
	}
}

// headersOf is an AMQP table as Headers: the inverse of amqpTable.
func headersOf(t amqp.Table) Headers {
	if t == nil {
		return nil
	}
	h := make(Headers, len(t))
	for k, v := range t {
		h[k] = coreValue(v)
	}
	return h
}

// coreValue is an AMQP header value as a header value (Headers).
func coreValue(v any) any {
	switch x := v.(type) {
	case amqp.Decimal:
		return Decimal{Scale: x.Scale, Value: x.Value}
	case amqp.Table:
		return headersOf(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = coreValue(e)
		}
		return out
	default:
		return v
	}
}

// amqpUnsendable is why msg, published to exchange with routing key key,
// cannot be sent over AMQP to a broker that negotiated frameMax (0: none),
// or "" (unsendableReason).
func amqpUnsendable(exchange, key string, msg *Message, frameMax int) string {
	pub := publishing(msg)
	return unsendableReason(exchange, key, &pub, frameMax)
}
