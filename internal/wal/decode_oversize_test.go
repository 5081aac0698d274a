package wal

import (
	"strings"
	"testing"
)

// TestDecoderJudgesOversizeRowsBeforeCopying: a row above MaxMessageBytes
// (its payload alone, or all its values together) becomes a poison event
// that keeps only its id and routing key (for its dead-letter copy), with a
// reason naming the size; nothing else is copied out of the receive
// buffer. Rows within the limit are untouched.
func TestDecoderJudgesOversizeRowsBeforeCopying(t *testing.T) {
	m := testMapping
	m.MaxMessageBytes = 1000
	tests := []struct {
		name    string
		vals    []*string
		problem string // "" = a normal event
	}{
		{"within the limit", []*string{s("a"), s("k"), s(`"` + strings.Repeat("p", 900) + `"`), s(`{"h":1}`)}, ""},
		{"payload above", []*string{s("b"), s("k"), s(`"` + strings.Repeat("p", 1200) + `"`), nil}, "payload is 1202 bytes, above CDCRELAY_MAX_MESSAGE_BYTES (1000)"},
		{"row above", []*string{s("c"), s("k"), s(`"` + strings.Repeat("p", 600) + `"`), s(`{"h":"` + strings.Repeat("h", 600) + `"}`)}, "row is 1212 bytes, above CDCRELAY_MAX_MESSAGE_BYTES (1000)"},
	}
	d := NewDecoder(m)
	for _, msg := range [][]byte{encBegin(1, 1), encRelation(1, "public", "event_outbox", "id", "routing_key", "payload", "headers")} {
		if _, err := d.Decode(msg); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			step, err := d.Decode(encInsert(1, tt.vals...))
			if err != nil {
				t.Fatal(err)
			}
			ev := step.Event
			if step.Kind != stepEvent || ev.ID != *tt.vals[0] || ev.Problem != tt.problem {
				t.Fatalf("step %v event %q problem %q, want %q", step.Kind, ev.ID, ev.Problem, tt.problem)
			}
			if tt.problem != "" && (ev.Payload != nil || ev.Headers != nil || ev.RoutingKey != "k") {
				t.Fatalf("an oversize row was copied (payload %d bytes, headers %d bytes), or lost its routing key %q for the dead letter", len(ev.Payload), len(ev.Headers), ev.RoutingKey)
			}
			if tt.problem == "" && len(ev.Payload) != 902 {
				t.Fatalf("payload %d bytes", len(ev.Payload))
			}
		})
	}
}

// TestDecoderOversizeCountsMappedColumnsOnly: a large column the relay
// never reads does not make a row unsendable; the message is built from
// the mapped columns, which are within the limit.
func TestDecoderOversizeCountsMappedColumnsOnly(t *testing.T) {
	m := testMapping
	m.MaxMessageBytes = 1000
	d := NewDecoder(m)
	for _, msg := range [][]byte{encBegin(1, 1), encRelation(1, "public", "event_outbox", "id", "routing_key", "payload", "blob")} {
		if _, err := d.Decode(msg); err != nil {
			t.Fatal(err)
		}
	}
	step, err := d.Decode(encInsert(1, s("a"), s("k"), s(`{"n":1}`), s(strings.Repeat("b", 5000))))
	if err != nil {
		t.Fatal(err)
	}
	if step.Kind != stepEvent || step.Event.Problem != "" || string(step.Event.Payload) != `{"n":1}` {
		t.Fatalf("step %v problem %q payload %q: a large unread column made the row poison", step.Kind, step.Event.Problem, step.Event.Payload)
	}
}
