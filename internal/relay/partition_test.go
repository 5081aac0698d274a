package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

func byRoutingKey(d testenv.Delivery) string { return d.RoutingKey }

// TestIntegrationPartitionedPublishing: with four confirm channels every
// event arrives once, events of one routing key keep their commit order,
// and the slot ends past the last commit; a broker link reset in the
// middle loses nothing.
func TestIntegrationPartitionedPublishing(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	proxy := testenv.MustProxy(t, testenv.AMQPAddr())
	r := e.startRelay(map[string]string{"PUBLISH_CHANNELS": "4", "AMQP_URL": "amqp://guest:guest@" + proxy.Addr() + "/"})
	r.waitStreaming(t)
	ctx := context.Background()
	var rows []row
	var last uint64
	for i := range 100 {
		// 20 keys, rows of several keys in each transaction.
		err := e.db.QueryRow(ctx, `
			WITH ins AS (
				INSERT INTO event_outbox (routing_key, payload)
				SELECT 'order.' || ((g + $1) % 20), jsonb_build_object('event_type', 'TestEvent', 'n', g, 'tx', txid_current())
				FROM generate_series(1, 50) g RETURNING id::text, routing_key, payload::text)
			SELECT coalesce(json_agg(json_build_array(id, routing_key, payload))::text, '[]'), pg_current_wal_insert_lsn() - '0/0'::pg_lsn FROM ins`, i).
			Scan(new(string), &last)
		if err != nil {
			t.Fatal(err)
		}
		if i == 50 {
			proxy.Reset()
		}
	}
	dbRows, err := e.db.Query(ctx, `SELECT id::text, routing_key, payload::text FROM event_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for dbRows.Next() {
		var rw row
		if err := dbRows.Scan(&rw.id, &rw.key, &rw.payload); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, rw)
	}
	if len(rows) != 5000 {
		t.Fatalf("%d rows", len(rows))
	}
	waitAll(t, e.consumer, rows, 2*time.Minute)
	testenv.WaitConfirmed(t, e.db, slotName, pglsn(last)+1, 30*time.Second)
	dups := reportOrder(t, rows, e.consumer.Deliveries(), byRoutingKey)
	if n := counter(t, r.reg, "cdcrelay_reconnects_total", "side", "broker"); n < 1 {
		t.Fatalf("broker reconnects %v after a link reset", n)
	}
	t.Logf("4 channels, link reset mid-stream: %d events, 0 missing, %d duplicates, per-key order kept", len(rows), dups)
}
