package publish

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/inbox"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestMessage(t *testing.T) {
	commit := time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC)
	tests := []struct {
		name      string
		ev        wal.Event
		wantType  string
		wantTrace any
		headers   map[string]any // extra expected headers
		wantErr   bool
	}{
		{
			name: "plain payload",
			ev:   wal.Event{ID: "id1", RoutingKey: "k", Payload: []byte(`{"a":1}`)},
		},
		{
			name:     "type from the envelope",
			ev:       wal.Event{ID: "id1", Payload: []byte(`{"event_type":"OrderPlaced","data":{}}`)},
			wantType: "OrderPlaced",
		},
		{
			name:     "type column wins over the envelope",
			ev:       wal.Event{ID: "id1", Type: "Col", Payload: []byte(`{"event_type":"Env"}`)},
			wantType: "Col",
		},
		{
			name:      "trace context as a string in the envelope",
			ev:        wal.Event{ID: "id1", Payload: []byte(`{"trace_context":"` + tp + `"}`)},
			wantTrace: tp,
		},
		{
			name:      "trace context as an object in the envelope",
			ev:        wal.Event{ID: "id1", Payload: []byte(`{"trace_context":{"traceparent":"` + tp + `","tracestate":"x=y"}}`)},
			wantTrace: tp,
		},
		{
			name: "malformed trace context is not forwarded",
			ev:   wal.Event{ID: "id1", Payload: []byte(`{"trace_context":"00-zz-11-01"}`)},
		},
		{
			name: "non-string type in the envelope drops its trace context too",
			ev:   wal.Event{ID: "id1", Payload: []byte(`{"event_type":7,"trace_context":"` + tp + `"}`)},
		},
		{
			// Only "trace_context" brings the payload to the decoder, which
			// then matches "Event_Type" case-insensitively, as encoding/json does.
			name:      "case-variant type key read along with the trace context",
			ev:        wal.Event{ID: "id1", Payload: []byte(`{"Event_Type":"Variant","trace_context":"` + tp + `"}`)},
			wantType:  "Variant",
			wantTrace: tp,
		},
		{
			name:     "envelope names inside nested values are ignored",
			ev:       wal.Event{ID: "id1", Payload: []byte(`{"data":{"event_type":"Inner","trace_context":"` + tp + `"},"event_type":"Outer"}`)},
			wantType: "Outer",
		},
		{
			name:      "headers column is copied, its traceparent wins",
			ev:        wal.Event{ID: "id1", Headers: []byte(`{"traceparent":"` + tp + `","n":3,"f":1.5,"b":true,"o":{"x":"y"},"l":[1,"a"],"z":null}`), Payload: []byte(`{"trace_context":"00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01"}`)},
			wantTrace: tp,
			headers:   map[string]any{"n": int64(3), "f": Decimal{Scale: 1, Value: 15}, "b": true, "o": Headers{"x": "y"}, "l": []any{int64(1), "a"}},
		},
		{
			name:    "headers column that is not an object",
			ev:      wal.Event{ID: "id1", Headers: []byte(`[1,2]`), Payload: []byte(`{}`)},
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.ev.CommitLSN, tt.ev.CommitTime, tt.ev.Index = 0x16B3748, commit, 4
			msg, err := MessageOn(&tt.ev, 2)
			if tt.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if msg.ID != tt.ev.ID || msg.ContentType != "application/json" ||
				!msg.Time.Equal(commit) || string(msg.Body) != string(tt.ev.Payload) || msg.Type != tt.wantType {
				t.Fatalf("message %+v", msg)
			}
			// The AMQP adapter puts each field in its property, persistent.
			wire := publishing(&msg)
			if wire.MessageId != msg.ID || wire.DeliveryMode != amqp.Persistent || wire.ContentType != msg.ContentType ||
				!wire.Timestamp.Equal(msg.Time) || string(wire.Body) != string(msg.Body) || wire.Type != msg.Type ||
				len(wire.Headers) != len(msg.Headers) {
				t.Fatalf("on the wire %+v", wire)
			}
			if msg.Headers[HeaderTimeline] != int64(2) || msg.Headers[HeaderCommitLSN] != "0/16B3748" || msg.Headers[HeaderTxIndex] != int64(4) {
				t.Fatalf("position headers %v", msg.Headers)
			}
			if msg.Headers[HeaderTrace] != tt.wantTrace {
				t.Fatalf("traceparent %v, want %v", msg.Headers[HeaderTrace], tt.wantTrace)
			}
			for k, want := range tt.headers {
				got := msg.Headers[k]
				if !equal(got, want) {
					t.Fatalf("header %s = %#v, want %#v", k, got, want)
				}
			}
			if _, ok := msg.Headers["z"]; ok {
				t.Fatal("JSON null header forwarded")
			}
			if err := wire.Headers.Validate(); err != nil {
				t.Fatalf("headers rejected by amqp: %v", err)
			}
		})
	}
}

// TestMessageTimeline: a message carries its session's timeline as an
// AMQP long-long, the same on the stream and the backfill; without a known
// timeline it carries none, and a row's headers column never supplies one.
func TestMessageTimeline(t *testing.T) {
	row := func(backfill bool, headers string) *wal.Event {
		ev := &wal.Event{ID: "id1", RoutingKey: "k", Payload: []byte(`{}`), CommitLSN: 0x1B4890F, Index: 52, Backfill: backfill}
		if headers != "" {
			ev.Headers = []byte(headers)
		}
		return ev
	}
	for _, c := range []struct {
		name     string
		ev       *wal.Event
		timeline uint32
		want     any // nil: no header
	}{
		{"stream", row(false, ""), 2, int64(2)},
		{"backfill", row(true, ""), 2, int64(2)},
		{"the largest timeline", row(false, ""), ^uint32(0), int64(^uint32(0))},
		{"unknown timeline", row(false, ""), 0, nil},
		{"a row's own cdcrelay-timeline is replaced", row(false, `{"cdcrelay-timeline": 99, "x": 1}`), 3, int64(3)},
		{"a row's own cdcrelay-timeline is dropped", row(false, `{"cdcrelay-timeline": 99, "x": 1}`), 0, nil},
	} {
		msg, err := MessageOn(c.ev, c.timeline)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, present := msg.Headers[HeaderTimeline]
		if (c.want == nil && present) || (c.want != nil && got != c.want) {
			t.Errorf("%s: %s = %#v (present %v), want %#v", c.name, HeaderTimeline, got, present, c.want)
		}
		if msg.Headers[HeaderCommitLSN] != "0/1B4890F" || msg.Headers[HeaderTxIndex] != int64(52) {
			t.Errorf("%s: pair headers %v", c.name, msg.Headers)
		}
		if err := publishing(&msg).Headers.Validate(); err != nil {
			t.Errorf("%s: headers rejected by amqp: %v", c.name, err)
		}
	}
	// Invariant 12: the same row on both paths of one session, one message.
	stream, err := MessageOn(row(false, `{"x": 1}`), 5)
	if err != nil {
		t.Fatal(err)
	}
	backfill, err := MessageOn(row(true, `{"x": 1}`), 5)
	if err != nil {
		t.Fatal(err)
	}
	if !equal(stream.Headers, backfill.Headers) {
		t.Errorf("stream headers %#v, backfill headers %#v", stream.Headers, backfill.Headers)
	}
	if plain, err := MessageOn(row(false, ""), 0); err != nil || plain.Headers[HeaderTimeline] != nil {
		t.Errorf("Message: %v, %s = %#v; want no timeline", err, HeaderTimeline, plain.Headers[HeaderTimeline])
	}
}

func TestLSNText(t *testing.T) {
	for _, lsn := range []pglogrepl.LSN{0, 1, 0xA, 0x16B3748, 0xFFFFFFFF, 1 << 32, 0x5A3C2F18, 0xABCDEF0123456789, 0x0000000F000000F0, ^pglogrepl.LSN(0)} {
		if got, want := lsnText(lsn), lsn.String(); got != want {
			t.Errorf("lsnText(%#x) = %q, want %q", uint64(lsn), got, want)
		}
	}
}

// equal compares header values exactly, types included: an amqp.Table
// equals only an amqp.Table, Headers only Headers.
func equal(a, b any) bool {
	switch x := a.(type) {
	case Headers:
		y, ok := b.(Headers)
		return ok && equalMaps(x, y)
	case amqp.Table:
		y, ok := b.(amqp.Table)
		return ok && equalMaps(x, y)
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equal(x[i], y[i]) {
				return false
			}
		}
		return true
	default:
		return a == b
	}
}

func equalMaps(x, y map[string]any) bool {
	if len(x) != len(y) {
		return false
	}
	for k := range x {
		if !equal(x[k], y[k]) {
			return false
		}
	}
	return true
}

// TestWireContract: what MessageOn writes is what the public inbox package
// reads (inbox.PositionOf): the same header names, the commit LSN in a
// text inbox parses back to the same LSN and prints (Position.LSNText) the
// same way, the index and the timeline as integers it accepts. A change on
// either side that a consumer would see fails here.
func TestWireContract(t *testing.T) {
	for _, c := range []struct {
		lsn      pglogrepl.LSN
		index    int
		timeline uint32
	}{
		{0x16B3748, 0, 0}, {1 << 32, 3, 1}, {0xABCDEF0123456789, 41, 7}, {^pglogrepl.LSN(0), 1 << 20, 0xFFFFFFFF},
	} {
		ev := &wal.Event{ID: "1", CommitLSN: c.lsn, Index: c.index, Payload: []byte(`{}`)}
		msg, err := MessageOn(ev, c.timeline)
		if err != nil {
			t.Fatal(err)
		}
		wire := publishing(&msg) // the table the AMQP adapter sends
		got := inbox.PositionOf(wire.Headers)
		want := inbox.Position{Timeline: c.timeline, CommitLSN: uint64(c.lsn), TxIndex: int64(c.index), Valid: true}
		if got != want {
			t.Errorf("inbox reads %+v from %v, want %+v", got, wire.Headers, want)
		}
		if text := msg.Headers[HeaderCommitLSN]; text != got.LSNText() {
			t.Errorf("the relay writes the commit LSN %v, inbox prints it %q", text, got.LSNText())
		}
	}
}
