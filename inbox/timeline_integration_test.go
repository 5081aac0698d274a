package inbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/inbox"
)

// TestIntegrationOrderAcrossTimelines: a ledger created before the
// timeline column gains it from Migrate, and Handle orders by (timeline,
// commit LSN, index): after a promotion the new timeline's events are next
// even below, or on, the pairs the old timeline delivered (h48); an old
// timeline's event after them is late; a message without the header
// compares by pair, as before.
func TestIntegrationOrderAcrossTimelines(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	// A ledger of an inbox older than the column.
	if _, err := e.conn.Exec(ctx, `ALTER TABLE cdcrelay_inbox_order DROP COLUMN timeline`); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, e.conn); err != nil {
		t.Fatalf("Migrate on a ledger without the timeline column: %v", err)
	}
	ib, _ := newInbox(t, e, 0)
	type msg struct {
		id, key, lsn string
		timeline     int64 // 0: no header
		want         inbox.Order
	}
	msgs := []msg{
		{"a1", "k", "0/1C045D8", 1, inbox.OrderFirst},
		{"a2", "k", "0/1B4890F", 2, inbox.OrderNext}, // below the old timeline's pair: a snapshot row of the promoted node
		{"a3", "k", "0/1C045D8", 2, inbox.OrderNext}, // the very pair of a1, another event
		{"a4", "k", "0/1D00000", 1, inbox.OrderLate}, // a phantom of the old primary, after the new timeline's
		{"a5", "k", "0/1C045D9", 0, inbox.OrderNext}, // no header: by pair
		{"a6", "k", "0/1C045D9", 2, inbox.OrderNext}, // equal pair, the header back: by pair, then recorded
		{"a7", "k", "0/100", 3, inbox.OrderNext},     // a second promotion
	}
	for _, m := range msgs {
		h := amqp.Table{inbox.HeaderCommitLSN: m.lsn, inbox.HeaderTxIndex: int64(0)}
		if m.timeline != 0 {
			h[inbox.HeaderTimeline] = m.timeline
		}
		if err := e.ch.PublishWithContext(ctx, e.exchange, m.key, true, false, amqp.Publishing{
			MessageId: m.id, Headers: h, DeliveryMode: amqp.Persistent, Body: []byte(`{}`),
		}); err != nil {
			t.Fatal(err)
		}
	}
	_, deliveries := e.consume(t, 1)
	for _, m := range msgs {
		d := next(t, deliveries)
		var got inbox.Order
		res, err := ib.Handle(ctx, d, "tl", func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
			got = ev.Order
			return insertEffect(ctx, tx, ev)
		})
		if err != nil || res != inbox.Handled || d.MessageId != m.id || got != m.want {
			t.Errorf("%s: %v, %v, order %v; want handled, %v", d.MessageId, res, err, got, m.want)
		}
	}
	var timeline *int64
	var lsn, id string
	if err := e.conn.QueryRow(ctx, `SELECT timeline, commit_lsn::text, message_id FROM cdcrelay_inbox_order WHERE handler = 'tl' AND routing_key = 'k'`).
		Scan(&timeline, &lsn, &id); err != nil {
		t.Fatal(err)
	}
	if timeline == nil || *timeline != 3 || lsn != "0/100" || id != "a7" {
		t.Errorf("the key's record: timeline %v, %s, %s; want 3, 0/100, a7", timeline, lsn, id)
	}
}
