package relaytest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/inbox"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// Row is an inserted outbox row.
type Row struct {
	ID, Key, Payload string
}

// insertSQL inserts n rows in one statement; n runs 1..n in the payload so
// the checks can match each row's index in its transaction.
const insertSQL = `
	INSERT INTO event_outbox (routing_key, payload)
	SELECT $1, jsonb_build_object('n', g, 'tx', txid_current(), 'event_type', 'TestEvent')
	FROM generate_series(1, $2) g
	RETURNING id::text, routing_key, payload::text`

// Insert inserts n rows with routing key key inside tx, each with a unique
// payload, and returns them in insertion order.
func Insert(ctx context.Context, tx pgx.Tx, key string, n int) ([]Row, error) {
	rows, err := tx.Query(ctx, insertSQL, key, n)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var rw Row
		err := r.Scan(&rw.ID, &rw.Key, &rw.Payload)
		return rw, err
	})
}

// IDs are the rows' ids.
func IDs(rows []Row) []string {
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	return ids
}

// WaitDelivered waits until every id has reached c at least once. On
// timeout it calls onTimeout, if not nil, to explain, then fails.
func WaitDelivered(t testing.TB, c *testenv.Consumer, ids []string, within time.Duration, onTimeout func()) {
	t.Helper()
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	seen := make(map[string]bool, len(want))
	next := 0
	deadline := time.Now().Add(within)
	for {
		for _, d := range c.DeliveriesFrom(next) {
			next++
			if want[d.MessageID] {
				seen[d.MessageID] = true
			}
		}
		if len(seen) == len(want) {
			return
		}
		if time.Now().After(deadline) {
			if onTimeout != nil {
				onTimeout()
			}
			t.Fatalf("%d of %d distinct events delivered after %s", len(seen), len(want), within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Position is where a delivery's event stands in commit order: its
// transaction's commit LSN and its index in the transaction, from the
// relay's headers.
type Position struct {
	LSN   pglogrepl.LSN
	Index int64
}

// PositionOf reads d's position from its headers the way a consumer does
// (inbox.PositionOf: one reading of the wire contract for the relay, its
// tests and its consumers), and insists on the relay's own encoding of the
// index, a long-long.
func PositionOf(d testenv.Delivery) (Position, error) {
	p := inbox.PositionOf(d.Headers)
	if !p.Valid {
		return Position{}, fmt.Errorf("no valid commit LSN and index in %s %v, %s %#v",
			inbox.HeaderCommitLSN, d.Headers[inbox.HeaderCommitLSN], inbox.HeaderTxIndex, d.Headers[inbox.HeaderTxIndex])
	}
	if _, ok := d.Headers[inbox.HeaderTxIndex].(int64); !ok {
		return Position{}, fmt.Errorf("index header %#v, want an int64", d.Headers[inbox.HeaderTxIndex])
	}
	return Position{pglogrepl.LSN(p.CommitLSN), p.TxIndex}, nil
}

// CommitLSN is the commit LSN header of id's first delivery to c: a slot
// confirmed at or below it has not passed that transaction, since logical
// decoding sends again every transaction whose commit record is not below
// the confirmed position.
func CommitLSN(t testing.TB, c *testenv.Consumer, id string) pglogrepl.LSN {
	t.Helper()
	for _, d := range c.Deliveries() {
		if d.MessageID != id {
			continue
		}
		p, err := PositionOf(d)
		if err != nil {
			t.Fatalf("delivery of %s: %v", id, err)
		}
		return p.LSN
	}
	t.Fatalf("event %s not delivered", id)
	return 0
}

// After reports whether p comes strictly after prev in commit order.
func (p Position) After(prev Position) bool {
	return p.LSN > prev.LSN || (p.LSN == prev.LSN && p.Index > prev.Index)
}
