// Package publish owns the broker side: the AMQP connection, its
// confirm-mode channels, the bounded in-flight window, the poison decision
// and the hand-off of each confirm (or park) to the Acker; the janitor's
// session, not this package, moves the watermark once the event's row is
// marked (invariant 10, docs/architecture.md). A lane is one
// confirm-mode AMQP channel with its own window; CDCRELAY_PUBLISH_CHANNELS
// sets how many, and an event's routing key picks its lane (LaneOf).
//
// The broker sits behind one seam, the sink and sinkLane interfaces of
// sink.go. The core (publisher.go, confirm.go, drain.go, abort.go,
// returns.go, poison.go, fate.go, carryover.go, refusals.go, metrics.go)
// reaches the broker only through it; link.go is the AMQP adapter (Dial,
// Link and its lanes). A new sink implements sink and sinkLane with the
// guarantees written there, and passes runSinkConformance
// (sink_conformance_test.go), as the AMQP link and the model test's fake
// broker do. No broker's type crosses the seam: the core builds a Message
// (this file, envelope.go, poison.go), and the adapter turns it into
// amqp091-go's (amqpmsg.go) and judges whether AMQP can carry it
// (validate.go); the sink classifies why a lane closed (closure), so the
// core reads no close codes.
package publish

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdcrelay/cdcrelay/inbox"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// Header names the relay sets on every message so consumers can deduplicate
// (with message_id) and detect reordering. The ordering headers are the
// public inbox package's constants, not a copy: they are the wire contract
// a consumer compiles against, so the relay takes them from the consumer's
// side. The other direction would make the public package import an
// internal one and link the relay's pipeline into every consumer; this
// one adds a single edge from publish to a package that imports nothing of
// the relay's and no library the relay does not link already.
// TestWireContract (message_test.go) checks that inbox reads back what
// MessageOn writes.
const (
	HeaderCommitLSN = inbox.HeaderCommitLSN // commit LSN of the event's transaction, e.g. "0/1A2B3C" (lsnText)
	HeaderTxIndex   = inbox.HeaderTxIndex   // position of the event among its transaction's outbox rows
	HeaderTrace     = "traceparent"         // W3C trace context, when the row carries one
	// HeaderTimeline is the server's timeline at the session that
	// published the message (IDENTIFY_SYSTEM): a promoted standby reuses
	// LSNs the old primary used for transactions it never received, so
	// the commit LSN and index alone repeat and go back across a
	// failover; (timeline, commit LSN, index) does not (docs/messages.md).
	HeaderTimeline = inbox.HeaderTimeline
)

// Message is an event's message as the core builds it and hands it to a
// sink: every message is persistent and mandatory (sinkLane.publish), so
// neither is a field. The AMQP adapter maps the fields to AMQP's
// properties of the same meaning (amqpmsg.go); docs/messages.md is the
// contract on the wire.
type Message struct {
	ID          string    // the outbox row's id (message_id); empty when it travels as HeaderID
	Type        string    // the event's type
	ContentType string    // the body's media type
	Time        time.Time // the transaction's commit time
	Headers     Headers
	Body        []byte

	// sinkHeaders is the sink's own form of Headers, which a sink may keep
	// between judging the message (sink.unsendable) and publishing it, so
	// that it converts the headers once (amqpmsg.go, amqpHeaders). The
	// core never changes a message once a sink has seen it.
	sinkHeaders any
}

// Headers are a message's headers. A value is a string, a bool, an int64,
// a Decimal, Headers, or a []any of these (where nil stands for a null
// element): the values that carry a JSON header exactly (docs/messages.md,
// "Header values").
type Headers map[string]any

// Decimal is an exact decimal number: Value × 10^-Scale.
type Decimal struct {
	Scale uint8
	Value int32
}

// MessageOn builds the message for an event published by a session
// on timeline (0: unknown): persistent, message_id = outbox id, the
// timeline, commit LSN and index as headers, the row's headers column
// copied in, and the trace context when the row or envelope carries one.
// The stream and the snapshot backfill of one session pass the same
// timeline, so a row gives the same message on both (invariant 12,
// docs/architecture.md).
func MessageOn(ev *wal.Event, timeline uint32) (Message, error) {
	headers := Headers{}
	if len(ev.Headers) > 0 {
		raw, err := decodeHeaders(ev.Headers)
		if err != nil {
			return Message{}, fmt.Errorf("event %s: headers column is not a JSON object: %w", ev.ID, err)
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
	// The relay's ordering headers are its own, as the commit LSN and the
	// index are: a row's headers column never supplies a timeline, which a
	// consumer would compare as if the relay had sent it.
	if timeline > 0 {
		headers[HeaderTimeline] = int64(timeline)
	} else {
		delete(headers, HeaderTimeline)
	}
	return Message{
		Headers:     headers,
		ContentType: "application/json",
		ID:          ev.ID,
		Time:        ev.CommitTime,
		Type:        typ,
		Body:        ev.Payload,
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

// decodeHeaders decodes the headers column, a JSON object (or null),
// keeping every number as its JSON text (json.Number): a float64 would
// round integers above 2^53 and fail on numbers beyond its range, and the
// header must carry the value as stored (docs/messages.md, "Header
// values"). Like json.Unmarshal, it refuses anything after the object.
func decodeHeaders(b []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var raw map[string]any
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("more data after the first JSON value")
	}
	return raw, nil
}

// tableValue converts a decoded JSON value to a header value (Headers),
// keeping its exact value (docs/messages.md, "Header values"). A null
// member of an object is dropped, as absent and null mean the same to a
// header reader; a null array element stays nil (AMQP's void), so the
// elements after it keep their positions.
func tableValue(v any) (any, bool) {
	switch x := v.(type) {
	case nil:
		return nil, false
	case json.Number:
		return numberValue(string(x)), true
	case map[string]any:
		t := make(Headers, len(x))
		for k, e := range x {
			if c, ok := tableValue(e); ok {
				t[k] = c
			}
		}
		return t, true
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i], _ = tableValue(e) // nil stays nil: AMQP void
		}
		return out, true
	default: // string, bool
		return x, true
	}
}

// numberValue is the header value of the JSON number text s, the most
// precise type from which s can be written back exactly (numberText):
// an integer that fits int64 is an int64 (AMQP's 'l'); a number with a
// fraction and no exponent whose digits fit AMQP's decimal (an int32 and a
// scale) is a Decimal ('D'); everything else (integers beyond int64,
// longer decimals, exponent forms such as 1e400, and negative zero, which
// neither type can sign) is a string holding s itself. AMQP has no exact
// type for those, and a double would change them.
func numberValue(s string) any {
	if strings.ContainsAny(s, "eE") || s == "-0" || (strings.HasPrefix(s, "-0.") && strings.Trim(s, "-0.") == "") {
		return s
	}
	intPart, frac, hasFrac := strings.Cut(s, ".")
	if !hasFrac {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return n
		}
		return s
	}
	if len(frac) > math.MaxUint8 {
		return s
	}
	// JSON has no leading zeros beyond a lone "0", so the digits without
	// the point read back to s once the point is put back at len(frac).
	v, err := strconv.ParseInt(intPart+frac, 10, 32)
	if err != nil {
		return s
	}
	return Decimal{Scale: uint8(len(frac)), Value: int32(v)}
}
