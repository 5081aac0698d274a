// Package publish owns the broker side: the AMQP connection, the
// confirm-mode channel, the bounded in-flight window and the mapping of
// confirms back to the ack watermark.
package publish

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"

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

// envelope is the part of a payload the relay looks at.
type envelope struct {
	EventType    string          `json:"event_type"`
	TraceContext json.RawMessage `json:"trace_context"`
}

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
		var env envelope
		if json.Unmarshal(ev.Payload, &env) == nil {
			if typ == "" {
				typ = env.EventType
			}
			if tp := traceparent(env.TraceContext); tp != "" && headers[HeaderTrace] == nil {
				headers[HeaderTrace] = tp
			}
		}
	}
	headers[HeaderCommitLSN] = ev.CommitLSN.String()
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

// traceparent accepts a trace context given as the traceparent string itself
// or as an object with a "traceparent" member.
func traceparent(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return validTraceparent(s)
	}
	var obj struct {
		Traceparent string `json:"traceparent"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		return validTraceparent(obj.Traceparent)
	}
	return ""
}

// validTraceparent keeps s only if it has the W3C shape
// version-traceid-parentid-flags (2-32-16-2 hex digits).
func validTraceparent(s string) string {
	parts := strings.Split(s, "-")
	if len(parts) < 4 || len(parts[0]) != 2 || len(parts[1]) != 32 || len(parts[2]) != 16 || len(parts[3]) != 2 {
		return ""
	}
	for _, p := range parts[:4] {
		for _, c := range p {
			if !strings.ContainsRune("0123456789abcdef", c) {
				return ""
			}
		}
	}
	return s
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
