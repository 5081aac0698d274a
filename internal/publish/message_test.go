package publish

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	amqp "github.com/rabbitmq/amqp091-go"

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
			headers:   map[string]any{"n": int64(3), "f": amqp.Decimal{Scale: 1, Value: 15}, "b": true, "o": amqp.Table{"x": "y"}, "l": []any{int64(1), "a"}},
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
			msg, err := Message(&tt.ev)
			if tt.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if msg.MessageId != tt.ev.ID || msg.DeliveryMode != amqp.Persistent || msg.ContentType != "application/json" ||
				!msg.Timestamp.Equal(commit) || string(msg.Body) != string(tt.ev.Payload) || msg.Type != tt.wantType {
				t.Fatalf("message %+v", msg)
			}
			if msg.Headers[HeaderCommitLSN] != "0/16B3748" || msg.Headers[HeaderTxIndex] != int64(4) {
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
			if err := msg.Headers.Validate(); err != nil {
				t.Fatalf("headers rejected by amqp: %v", err)
			}
		})
	}
}

func TestLSNText(t *testing.T) {
	for _, lsn := range []pglogrepl.LSN{0, 1, 0xA, 0x16B3748, 0xFFFFFFFF, 1 << 32, 0x5A3C2F18, 0xABCDEF0123456789, 0x0000000F000000F0, ^pglogrepl.LSN(0)} {
		if got, want := lsnText(lsn), lsn.String(); got != want {
			t.Errorf("lsnText(%#x) = %q, want %q", uint64(lsn), got, want)
		}
	}
}

func equal(a, b any) bool {
	switch x := a.(type) {
	case amqp.Table:
		y, ok := b.(amqp.Table)
		if !ok || len(x) != len(y) {
			return false
		}
		for k := range x {
			if !equal(x[k], y[k]) {
				return false
			}
		}
		return true
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
