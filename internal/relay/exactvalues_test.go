package relay_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
	"github.com/cdcrelay/cdcrelay/migrations"
)

// This file: the same row gives the same message on the backfill and the
// stream paths, with its values exactly as stored (invariant 12, docs/architecture.md;
// docs/messages.md, "Header values").

// exactRow is a row inserted once before the relay adopts the slot
// (backfilled) and once after it streams: key names the pair.
type exactRow struct {
	key, payload, headers string
}

// deliveredBothWays inserts each row before the relay starts (the new
// slot's snapshot backfills it, routing key "pre.<key>") and again once it
// streams ("post.<key>"), and returns both deliveries of each row by key.
// db must talk UTF-8 (the rows are Go strings).
func deliveredBothWays(t *testing.T, e *env, db *pgx.Conn, rows []exactRow) (pre, post map[string]testenv.Delivery) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Exec(ctx, `ALTER TABLE event_outbox ADD COLUMN headers jsonb`); err != nil {
		t.Fatal(err)
	}
	insert := func(prefix string) []string {
		var ids []string
		for _, r := range rows {
			var id string
			if err := db.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload, headers) VALUES ($1, $2::jsonb, $3::jsonb) RETURNING id::text`,
				prefix+r.key, r.payload, r.headers).Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	ids := insert("pre.")
	run := e.startRelay(nil)
	run.waitStreaming(t)
	ids = append(ids, insert("post.")...)
	relaytest.WaitDelivered(t, e.consumer, ids, 30*time.Second, nil)
	pre, post = map[string]testenv.Delivery{}, map[string]testenv.Delivery{}
	for _, d := range e.consumer.Deliveries() {
		if k, ok := strings.CutPrefix(d.RoutingKey, "pre."); ok {
			pre[k] = d
		} else if k, ok := strings.CutPrefix(d.RoutingKey, "post."); ok {
			post[k] = d
		}
	}
	for _, r := range rows {
		b, okb := pre[r.key]
		if _, ok := post[r.key]; !ok || !okb {
			for _, d := range e.consumer.Deliveries() {
				t.Logf("delivered: routing key %q body %q headers %#v", d.RoutingKey, d.Body, d.Headers)
			}
		}
		s, oks := post[r.key]
		if !okb || !oks {
			t.Fatalf("row %q: backfilled %v, streamed %v", r.key, okb, oks)
		}
		if string(b.Body) != string(s.Body) {
			t.Errorf("row %q: backfilled body %q, streamed body %q", r.key, b.Body, s.Body)
		}
		if bh, sh := userHeaders(b.Headers), userHeaders(s.Headers); !reflect.DeepEqual(bh, sh) {
			t.Errorf("row %q: backfilled headers %#v, streamed headers %#v", r.key, bh, sh)
		}
	}
	return pre, post
}

// userHeaders are the headers that come from the row's headers column.
func userHeaders(h map[string]any) map[string]any {
	out := make(map[string]any, len(h))
	for k, v := range h {
		if k != publish.HeaderCommitLSN && k != publish.HeaderTxIndex && k != publish.HeaderTimeline {
			out[k] = v
		}
	}
	return out
}

// TestIntegrationHeaderValuesExact: numbers a float64 would round or could
// not hold, decimals, nested objects and arrays arrive with their exact
// values (docs/messages.md, "Header values") on both paths, none parked.
func TestIntegrationHeaderValuesExact(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	headers := `{"tenant_id": 1234567890123456789, "above_2_53": 9007199254740993, "price": 12.50,
		"negative": -0.05, "huge": 1e400, "beyond_int64": 123456789012345678901234567890,
		"long_decimal": 3.14159265358979323846, "gone": null,
		"nested": {"ids": [1, null, 9223372036854775807, "x"], "flag": true, "inner": {"m": 2.5}}}`
	want := map[string]any{
		"tenant_id": int64(1234567890123456789), "above_2_53": int64(9007199254740993),
		"price": amqp.Decimal{Scale: 2, Value: 1250}, "negative": amqp.Decimal{Scale: 2, Value: -5},
		// jsonb keeps a number as PostgreSQL numeric and renders 1e400 in
		// full: that text is the stored value, on both paths.
		"huge": "1" + strings.Repeat("0", 400), "beyond_int64": "123456789012345678901234567890", "long_decimal": "3.14159265358979323846",
		"nested": amqp.Table{"ids": []any{int64(1), nil, int64(9223372036854775807), "x"}, "flag": true,
			"inner": amqp.Table{"m": amqp.Decimal{Scale: 1, Value: 25}}},
	}
	pre, post := deliveredBothWays(t, e, e.db, []exactRow{{key: "numbers", payload: `{"n": 1}`, headers: headers}})
	for path, d := range map[string]testenv.Delivery{"backfill": pre["numbers"], "stream": post["numbers"]} {
		if got := userHeaders(d.Headers); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: headers\n%#v\nwant\n%#v", path, got, want)
		}
	}
	var parked int
	if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM event_outbox WHERE attempts > 0`).Scan(&parked); err != nil || parked != 0 {
		t.Fatalf("parked rows: %d, %v", parked, err)
	}
}

// TestIntegrationLatin1SameBytes: in a LATIN1 database, bodies, routing
// keys and header strings with non-ASCII characters arrive as the same
// UTF-8 on both paths.
func TestIntegrationLatin1SameBytes(t *testing.T) {
	e, db := newLatin1Env(t)
	rows := []exactRow{
		{key: "café", payload: `{"city": "Zürich", "drink": "café", "all": "ÀÿØ ¡¿ ß"}`,
			headers: `{"x-city": "Zürich", "nested": {"n": "café"}, "list": ["Ø", 1]}`},
		{key: "ascii", payload: `{"a": "plain"}`, headers: `{"x": "y"}`},
	}
	pre, post := deliveredBothWays(t, e, db, rows)
	for path, got := range map[string]map[string]testenv.Delivery{"backfill": pre, "stream": post} {
		d := got["café"]
		if !utf8.Valid(d.Body) || string(d.Body) != `{"all": "ÀÿØ ¡¿ ß", "city": "Zürich", "drink": "café"}` {
			t.Errorf("%s: body %q", path, d.Body)
		}
		if d.RoutingKey != map[string]string{"backfill": "pre.café", "stream": "post.café"}[path] {
			t.Errorf("%s: routing key %q", path, d.RoutingKey)
		}
		want := map[string]any{"x-city": "Zürich", "nested": amqp.Table{"n": "café"}, "list": []any{"Ø", int64(1)}}
		if h := userHeaders(d.Headers); !reflect.DeepEqual(h, want) {
			t.Errorf("%s: headers %#v, want %#v", path, h, want)
		}
	}
}

// newLatin1Env is newEnv with the outbox in a LATIN1 database. It returns
// the env and a connection of the test's own that talks UTF-8; the relay's
// URL sets no client_encoding, as an operator's usually does not.
func newLatin1Env(t *testing.T) (*env, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	amqpURL := testenv.RequireAMQP(t)
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	admin := relaytest.Connect(t, pg.URL("postgres"))
	if _, err := admin.Exec(ctx, `CREATE DATABASE app ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0`); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, pg: pg, dbURL: pg.URL("app"), amqpURL: amqpURL, exchange: testenv.UniqueName("cdcrelay.test")}
	e.db = relaytest.Connect(t, e.dbURL+"&client_encoding=UTF8")
	if err := migrations.Apply(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	var enc string
	if err := e.db.QueryRow(ctx, `SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = current_database()`).Scan(&enc); err != nil || enc != "LATIN1" {
		t.Fatal(fmt.Errorf("database encoding %q: %w", enc, err))
	}
	e.consumer = testenv.MustConsumer(t, amqpURL, e.exchange, testenv.UniqueName("cdcrelay.q"), "#")
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = testenv.DeleteExchange(cctx, amqpURL, e.exchange)
	})
	e.relayURL = leastPrivilegeRole(t, e.db, e.dbURL)
	return e, e.db
}
