package wal

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// benchPayload is an outbox payload as the bench (tools/bench)
// inserts it: a 209-byte JSON envelope in jsonb's text form.
const benchPayload = `{"id": "5f4dcc3b-5aa7-65d6-1d83-27deb882cf99", "data": {"customer": "customer-150", "order_id": 50000}, "event_type": "OrderCreated", "trace_context": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`

// benchRow is a realistic event_outbox tuple: a UUID, a routing key, the
// payload, a timestamptz, NULL published_at, attempts and NULL last_error.
func benchRow() []byte {
	return encInsert(1, s("0b1c7a52-8d0e-4c55-9a43-3f1e2d7c9b10"), s("bench.order.created"), s(benchPayload),
		s("2026-11-30 03:45:17.123456+00"), nil, s("0"), nil)
}

// BenchmarkDecodeInsert decodes one outbox Insert inside an open
// transaction: the per-event work of the WAL reader (parse, map the
// columns, copy what the event keeps out of the receive buffer).
func BenchmarkDecodeInsert(b *testing.B) {
	d := NewDecoder(testMapping)
	for _, m := range [][]byte{encRelation(1, "public", "event_outbox", outboxCols...), encBegin(0x500, 7)} {
		if _, err := d.Decode(m); err != nil {
			b.Fatal(err)
		}
	}
	msg := benchRow()
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		step, err := d.Decode(msg)
		if err != nil || step.Kind != stepEvent {
			b.Fatalf("kind %v err %v", step.Kind, err)
		}
	}
}

// BenchmarkDecodeTransaction decodes a whole single-row transaction
// (Begin, Insert, Commit): the per-event work when every event commits on
// its own, as in the 1,000 ev/s latency phase.
func BenchmarkDecodeTransaction(b *testing.B) {
	d := NewDecoder(testMapping)
	if _, err := d.Decode(encRelation(1, "public", "event_outbox", outboxCols...)); err != nil {
		b.Fatal(err)
	}
	msgs := [][]byte{encBegin(0x500, 7), benchRow(), encCommit(0x500, 0x530)}
	b.ReportAllocs()
	for b.Loop() {
		for _, m := range msgs {
			if _, err := d.Decode(m); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkParseInsert is the pure parser's share of BenchmarkDecodeInsert.
func BenchmarkParseInsert(b *testing.B) {
	msg := benchRow()
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseMessage(msg); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReceive receives one XLogData message per op from a fake
// walsender over loopback, with the reader's reused receive context: through
// pgconn with the context (a context watcher registered and removed per
// message, as the reader once did), and through pgStream (the context's
// deadline and cancellation put on the socket once per context).
func BenchmarkReceive(b *testing.B) {
	for _, bc := range []struct {
		name    string
		receive func(conn *pgconn.PgConn) func(context.Context) (pgproto3.BackendMessage, error)
	}{
		{"pgconn-ctx", func(conn *pgconn.PgConn) func(context.Context) (pgproto3.BackendMessage, error) {
			return conn.ReceiveMessage
		}},
		{"pgStream", func(conn *pgconn.PgConn) func(context.Context) (pgproto3.BackendMessage, error) {
			return (&pgStream{conn: conn}).ReceiveMessage
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			msgs := make([][]byte, b.N)
			for i := range msgs {
				msgs[i] = benchRow()
			}
			conn, _ := budgetConn(b, msgs)
			receive := bc.receive(conn)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				m, err := receive(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, ok := m.(*pgproto3.CopyData); !ok {
					b.Fatalf("got %T", m)
				}
			}
		})
	}
}
