// Package publish owns the broker side: the AMQP connection, its
// confirm-mode channels, the bounded in-flight window, the poison decision
// and the mapping of confirms back to the ack watermark. A lane is one
// confirm-mode AMQP channel with its own window; CDCRELAY_PUBLISH_CHANNELS
// sets how many, and an event's routing key picks its lane (LaneOf).
package publish

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"github.com/jackc/pglogrepl"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// Header names the relay sets on every message so consumers can deduplicate
// (with message_id) and detect reordering.
const (
	HeaderCommitLSN = "cdcrelay-commit-lsn" // commit LSN of the event's transaction, e.g. "0/1A2B3C"
	HeaderTxIndex   = "cdcrelay-tx-index"   // position of the event among its transaction's outbox rows
	HeaderTrace     = "traceparent"         // W3C trace context, when the row carries one
)

// Message builds the AMQP message for an event: persistent, message_id =
// outbox id, the commit LSN and index as headers, the row's headers column
// copied in, and the trace context when the row or envelope carries one.
func Message(ev *wal.Event) (amqp.Publishing, error) {
	headers := amqp.Table{}
	if len(ev.Headers) > 0 {
		var raw map[string]any
		if err := json.Unmarshal(ev.Headers, &raw); err != nil {
			return amqp.Publishing{}, fmt.Errorf("event %s: headers column is not a JSON object: %w", ev.ID, err)
		}
		for k, v := range raw {
			if t, ok := tableValue(v); ok {
				headers[k] = t
			}
		}
	}
	typ := ev.Type
	// Only look inside the payload when it may hold something we use: most
	// payloads then cost one scan for two short strings, not a JSON parse.
	if (typ == "" && bytes.Contains(ev.Payload, []byte(`"event_type"`))) ||
		(headers[HeaderTrace] == nil && bytes.Contains(ev.Payload, []byte(`"trace_context"`))) {
		if envType, trace, ok := envelopeOf(ev.Payload); ok {
			if typ == "" {
				typ = string(envType)
			}
			if trace != nil && headers[HeaderTrace] == nil {
				headers[HeaderTrace] = string(trace)
			}
		}
	}
	headers[HeaderCommitLSN] = lsnText(ev.CommitLSN)
	headers[HeaderTxIndex] = int64(ev.Index)
	return amqp.Publishing{
		Headers:      headers,
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		MessageId:    ev.ID,
		Timestamp:    ev.CommitTime,
		Type:         typ,
		Body:         ev.Payload,
	}, nil
}

// lsnText formats lsn as pglogrepl.LSN.String does ("%X/%X", PostgreSQL's
// text form) without fmt's boxing and reflection, on every message.
func lsnText(lsn pglogrepl.LSN) string {
	var buf [len("FFFFFFFF/FFFFFFFF")]byte
	b := strconv.AppendUint(buf[:0], uint64(lsn>>32), 16)
	b = append(b, '/')
	b = strconv.AppendUint(b, uint64(uint32(lsn)), 16)
	for i, c := range b {
		if 'a' <= c && c <= 'f' {
			b[i] = c - ('a' - 'A') // %X is upper case, strconv lower
		}
	}
	return string(b)
}

// tableValue converts a decoded JSON value to one an AMQP table accepts.
// JSON null has no AMQP counterpart worth sending and is dropped.
func tableValue(v any) (any, bool) {
	switch x := v.(type) {
	case nil:
		return nil, false
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x), true
		}
		return x, true
	case map[string]any:
		t := amqp.Table{}
		for k, e := range x {
			if c, ok := tableValue(e); ok {
				t[k] = c
			}
		}
		return t, true
	case []any:
		out := make([]any, 0, len(x))
		for _, e := range x {
			if c, ok := tableValue(e); ok {
				out = append(out, c)
			}
		}
		return out, true
	default: // string, bool
		return x, true
	}
}
