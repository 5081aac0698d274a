package publish

import (
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// benchPayload is an outbox payload as the bench (tools/bench)
// inserts it: a JSON envelope with its own id, event_type and trace_context.
const benchPayload = `{"id": "5f4dcc3b-5aa7-65d6-1d83-27deb882cf99", "data": {"customer": "customer-150", "order_id": 50000}, "event_type": "OrderCreated", "trace_context": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`

func benchEvent() wal.Event {
	return wal.Event{
		ID: "0b1c7a52-8d0e-4c55-9a43-3f1e2d7c9b10", RoutingKey: "bench.order.created", Payload: []byte(benchPayload),
		CommitLSN: 0x5A3C2F18, CommitTime: time.Date(2026, 11, 30, 3, 45, 17, 0, time.UTC), Index: 3,
	}
}

// BenchmarkMessage builds the AMQP message for one event, the per-event
// work of the publisher besides the AMQP client itself.
//
//   - envelope: the default schema (no type column), a payload carrying
//     event_type and trace_context: the payload is parsed for both.
//   - type column: the table has an event_type column and the payload no
//     trace_context: no JSON parse.
//   - headers column: a headers JSONB object is copied into the AMQP table.
//   - check+envelope: what publish does per event: the poison check (which
//     validates the payload as JSON) and then Message.
func BenchmarkMessage(b *testing.B) {
	plain := benchEvent()
	plain.Type = "OrderCreated"
	plain.Payload = []byte(`{"id": "5f4dcc3b-5aa7-65d6-1d83-27deb882cf99", "data": {"customer": "customer-150", "order_id": 50000}, "kind": "OrderCreated"}`)
	withHeaders := benchEvent()
	withHeaders.Headers = []byte(`{"tenant": "acme", "schema_version": 3, "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`)
	cases := []struct {
		name  string
		ev    wal.Event
		check bool
	}{
		{"envelope", benchEvent(), false},
		{"type column", plain, false},
		{"headers column", withHeaders, false},
		{"check+envelope", benchEvent(), true},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			ev := c.ev
			b.SetBytes(int64(len(ev.Payload)))
			b.ReportAllocs()
			for b.Loop() {
				if c.check {
					if reason := poisonReason(&ev, 128<<20); reason != "" {
						b.Fatal(reason)
					}
				}
				msg, err := MessageOn(&ev, 0)
				if err != nil || msg.ID != ev.ID {
					b.Fatalf("message %+v: %v", msg, err)
				}
			}
		})
	}
}

// BenchmarkAMQPAdapter is the AMQP adapter's own per-message work, which
// the seam added: the message judged (Link.unsendable: converted, then
// walked by AMQP's rules) and converted again for amqp091-go (publishing),
// for the envelope event and for one with a headers column holding a
// nested object (the case that copies the table).
func BenchmarkAMQPAdapter(b *testing.B) {
	nested := benchEvent()
	nested.Headers = []byte(`{"tenant": "acme", "price": 12.50, "o": {"a": [1, "x"]}}`)
	for _, c := range []struct {
		name string
		ev   wal.Event
	}{{"envelope", benchEvent()}, {"nested headers", nested}} {
		msg, err := MessageOn(&c.ev, 1)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m := msg // each event's message is new to the sink
				if why := amqpUnsendable("outbox", c.ev.RoutingKey, &m, 131072); why != "" {
					b.Fatal(why)
				}
				if pub := publishing(&m); pub.MessageId != c.ev.ID {
					b.Fatalf("message id %q", pub.MessageId)
				}
			}
		})
	}
}
