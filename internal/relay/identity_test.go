package relay_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/migrations"
)

// identityEnv is newEnv for a database whose outbox the test builds
// itself: setup runs as the superuser on an empty database; no role is
// created until identityGrant.
func identityEnv(t *testing.T, setup string) *env {
	t.Helper()
	amqpURL := testenv.RequireAMQP(t)
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, pg: pg, dbURL: pg.URL("app"), amqpURL: amqpURL, exchange: testenv.UniqueName("cdcrelay.test")}
	e.db = e.connect()
	if setup != "" {
		if _, err := e.db.Exec(ctx, setup); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	e.relayURL = e.dbURL
	e.consumer = testenv.MustConsumer(t, amqpURL, e.exchange, testenv.UniqueName("cdcrelay.q"), "#")
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = testenv.DeleteExchange(cctx, amqpURL, e.exchange)
	})
	return e
}

// identityGrant creates the least-privilege role (docs/least-privilege.md)
// with its grants on schema.table and makes the relay run as it.
func identityGrant(t *testing.T, e *env, schema, table string) {
	t.Helper()
	qt, qs := pgx.Identifier{schema, table}.Sanitize(), pgx.Identifier{schema}.Sanitize()
	_, err := e.db.Exec(context.Background(), `
		CREATE ROLE cdcrelay_app LOGIN REPLICATION PASSWORD '`+relayRolePassword+`';
		GRANT USAGE ON SCHEMA `+qs+` TO cdcrelay_app;
		GRANT SELECT, DELETE ON `+qt+` TO cdcrelay_app;
		GRANT UPDATE (published_at, attempts, last_error) ON `+qt+` TO cdcrelay_app;`)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("cdcrelay_app", relayRolePassword)
	e.relayURL = u.String()
}

// identityInsert inserts n rows in one transaction into table (SQL text,
// quoted as needed) with id and routing key columns idCol and keyCol,
// enqueued at enqueued when not empty, and returns them with the WAL
// position after the commit.
func identityInsert(t *testing.T, db *pgx.Conn, table, idCol, keyCol, enqueued string, n int) ([]row, pglogrepl.LSN) {
	t.Helper()
	ctx := context.Background()
	cols, vals := keyCol+", payload", "$1, jsonb_build_object('n', g, 'tx', txid_current(), 'event_type', 'TestEvent')"
	args := []any{"identity.k", n}
	if enqueued != "" {
		cols, vals = cols+", enqueued_at", vals+", $3::timestamptz"
		args = append(args, enqueued)
	}
	rs, err := db.Query(ctx, `INSERT INTO `+table+` (`+cols+`) SELECT `+vals+` FROM generate_series(1, $2) g
		RETURNING `+idCol+`::text, `+keyCol+`, payload::text`, args...)
	if err != nil {
		t.Fatalf("insert into %s: %v", table, err)
	}
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
		var rw row
		err := r.Scan(&rw.id, &rw.key, &rw.payload)
		return rw, err
	})
	if err != nil {
		t.Fatalf("insert into %s: %v", table, err)
	}
	var after pglogrepl.LSN
	if err := db.QueryRow(ctx, `SELECT pg_current_wal_lsn()`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	return out, after
}

// identityWaitDelivered waits until every row has been delivered; on
// failure it says whether the slot was confirmed past their commit
// (committed) all the same: the silent skip this file guards against.
func identityWaitDelivered(t *testing.T, e *env, rows []row, committed pglogrepl.LSN, within time.Duration) {
	t.Helper()
	want := make(map[string]bool, len(rows))
	for _, r := range rows {
		want[r.id] = true
	}
	deadline := time.Now().Add(within)
	for {
		seen := map[string]bool{}
		for _, d := range e.consumer.Deliveries() {
			if want[d.MessageID] {
				seen[d.MessageID] = true
			}
		}
		if len(seen) == len(want) {
			return
		}
		if time.Now().After(deadline) {
			confirmed := testenv.ConfirmedFlush(t, e.db, slotName)
			t.Fatalf("%d of %d rows delivered after %s; slot confirmed %s, past their commit (%s): %v",
				len(seen), len(want), within, confirmed, committed, confirmed >= committed)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// identityWaitMarked waits until no row of table is left unpublished.
func identityWaitMarked(t *testing.T, db *pgx.Conn, table string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var n int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM `+table+` WHERE published_at IS NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows of %s still unmarked after %s", n, table, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// identityRefused starts the relay, expects it to end by itself with
// ErrPublication (a fatal error: the process exits non-zero) whose message
// holds want, and returns the message.
func identityRefused(t *testing.T, e *env, extra map[string]string, want string) string {
	t.Helper()
	r := e.startRelay(extra)
	err := r.Wait(t, 60*time.Second, "the relay to refuse to stream")
	if !errors.Is(err, slot.ErrPublication) || !strings.Contains(err.Error(), want) {
		t.Fatalf("relay ended with %v; want ErrPublication saying %q", err, want)
	}
	if r.relay.Streaming() {
		t.Fatal("streaming after the refusal")
	}
	return err.Error()
}

// TestIntegrationOutboxRenamedOrMovedMidStream: the outbox table is renamed
// (ALTER TABLE … RENAME) or moved (SET SCHEMA) while the relay streams.
// The relay follows the table by OID: later inserts are delivered before
// the slot is confirmed past them, and a warning names the remedy once.
// The next session start refuses to stream under the old name and says
// which name to configure; configured with the new name, it streams again.
func TestIntegrationOutboxRenamedOrMovedMidStream(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	for _, tc := range []struct {
		name, ddl, newTable, newQuoted string
	}{
		{"rename", `ALTER TABLE event_outbox RENAME TO outbox_v2`, "public.outbox_v2", `"public"."outbox_v2"`},
		{"set schema", `CREATE SCHEMA archive; GRANT USAGE ON SCHEMA archive TO cdcrelay_app; ALTER TABLE event_outbox SET SCHEMA archive`,
			"archive.event_outbox", `"archive"."event_outbox"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, testenv.PostgresOptions{}, "#")
			ctx := context.Background()
			r := e.startRelay(map[string]string{"STATUS_INTERVAL": statusesFast.String()})
			r.waitStreaming(t)
			before, _ := identityInsert(t, e.db, "event_outbox", "id", "routing_key", "", 5)
			waitAll(t, e.consumer, before, 30*time.Second)

			if _, err := e.db.Exec(ctx, tc.ddl); err != nil {
				t.Fatal(err)
			}
			began := time.Now()
			after, committed := identityInsert(t, e.db, tc.newQuoted, "id", "routing_key", "", 5)
			// On the old decoder these rows were skipped while the slot was
			// confirmed past them: delivery is what this waits for.
			identityWaitDelivered(t, e, after, committed, 30*time.Second)
			delivered := time.Since(began)
			report(t, append(before, after...), e.consumer.Deliveries())
			// Their rows cannot be marked under the configured name, so the
			// slot must stay before them (invariant 10, docs/architecture.md): the next session,
			// under the new name, publishes and marks them again.
			liveFor(t, r, time.Second) // status updates sent meanwhile, none past those rows
			if got := testenv.ConfirmedFlush(t, e.db, slotName); got >= committed {
				t.Fatalf("slot confirmed %s, past the renamed table's rows (committed %s) that were never marked", got, committed)
			}
			if !r.relay.Streaming() {
				t.Fatal("the relay stopped streaming after the rename")
			}
			// The text handler escapes the quotes of the names.
			warn := "was renamed or moved to " + strings.ReplaceAll(tc.newQuoted, `"`, `\"`)
			if n := strings.Count(r.logs.String(), warn); n != 1 {
				t.Fatalf("%d warnings %q, want 1:\n%s", n, warn, r.logs.String())
			}
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}

			confirmed := testenv.ConfirmedFlush(t, e.db, slotName)
			msg := identityRefused(t, e, nil, "set CDCRELAY_TABLE="+tc.newQuoted)
			if got := testenv.ConfirmedFlush(t, e.db, slotName); got != confirmed {
				t.Fatalf("the refused start moved the slot from %s to %s", confirmed, got)
			}

			follow := e.startRelay(map[string]string{"TABLE": tc.newTable})
			follow.waitStreaming(t)
			later, laterCommitted := identityInsert(t, e.db, tc.newQuoted, "id", "routing_key", "", 3)
			identityWaitDelivered(t, e, later, laterCommitted, 30*time.Second)
			testenv.WaitConfirmed(t, e.db, slotName, laterCommitted, 30*time.Second)
			var unmarked int
			if err := e.db.QueryRow(ctx, `SELECT count(*) FROM `+tc.newQuoted+` WHERE published_at IS NULL`).Scan(&unmarked); err != nil {
				t.Fatal(err)
			}
			if unmarked != 0 {
				t.Fatalf("%d rows unmarked after the relay followed the new name", unmarked)
			}
			t.Logf("%s mid-stream: 5 later rows delivered in %s, the slot kept before them while they could not be marked; next start refused: %q; with CDCRELAY_TABLE=%s: all marked, 3 more delivered, slot past them",
				tc.name, delivered.Round(time.Millisecond), msg, tc.newTable)
		})
	}
}

// identityPartitioned replaces the outbox by one partitioned by
// enqueued_at (the primary key includes the partition key), with a
// partition per year and a default one, and drops the publication.
const identityPartitioned = `
	DROP PUBLICATION cdcrelay_outbox;
	DROP TABLE event_outbox;
	CREATE TABLE event_outbox (
		id UUID NOT NULL DEFAULT gen_random_uuid(),
		routing_key TEXT NOT NULL,
		payload JSONB NOT NULL,
		enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now(),
		published_at TIMESTAMPTZ,
		attempts INT NOT NULL DEFAULT 0,
		last_error TEXT,
		PRIMARY KEY (id, enqueued_at)
	) PARTITION BY RANGE (enqueued_at);
	CREATE TABLE event_outbox_2025 PARTITION OF event_outbox FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
	CREATE TABLE event_outbox_2026 PARTITION OF event_outbox FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
	CREATE TABLE event_outbox_rest PARTITION OF event_outbox DEFAULT;
	CREATE INDEX event_outbox_unpublished_idx ON event_outbox (enqueued_at) WHERE published_at IS NULL;`

// TestIntegrationPartitionedOutbox: a partitioned outbox works end to end.
// The relay, as the table's owner, creates the publication itself through
// the partition root; rows committed before the slot (backfill) and after
// it (stream), in several partitions, are all delivered and marked. A
// publication without publish_via_partition_root is refused at start with
// the ALTER PUBLICATION that fixes it.
func TestIntegrationPartitionedOutbox(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	if _, err := e.db.Exec(ctx, identityPartitioned); err != nil {
		t.Fatal(err)
	}
	backlog, _ := identityInsert(t, e.db, "event_outbox", "id", "routing_key", "2025-06-01", 4)
	owner := map[string]string{"DATABASE_URL": e.dbURL}
	r := e.startRelay(owner)
	r.waitStreaming(t)
	rows := backlog
	for _, at := range []string{"2025-07-01", "", "2031-01-01"} { // 2025, this year, the default partition
		more, committed := identityInsert(t, e.db, "event_outbox", "id", "routing_key", at, 10)
		rows = append(rows, more...)
		identityWaitDelivered(t, e, rows, committed, 30*time.Second)
		testenv.WaitConfirmed(t, e.db, slotName, committed, 30*time.Second)
	}
	report(t, rows, e.consumer.Deliveries())
	identityWaitMarked(t, e.db, "event_outbox", 30*time.Second)
	var viaRoot, insertOnly bool
	err := e.db.QueryRow(ctx, `SELECT pubviaroot, pubinsert AND NOT (pubupdate OR pubdelete OR pubtruncate) FROM pg_publication WHERE pubname = 'cdcrelay_outbox'`).
		Scan(&viaRoot, &insertOnly)
	if err != nil || !viaRoot || !insertOnly {
		t.Fatalf("publication created by the relay: via root %v, insert only %v (%v)", viaRoot, insertOnly, err)
	}
	var partitions int
	if err := e.db.QueryRow(ctx, `SELECT count(DISTINCT tableoid) FROM event_outbox`).Scan(&partitions); err != nil || partitions != 3 {
		t.Fatalf("rows in %d partitions (%v), want 3", partitions, err)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}

	if _, err := e.db.Exec(ctx, `ALTER PUBLICATION cdcrelay_outbox SET (publish_via_partition_root = false)`); err != nil {
		t.Fatal(err)
	}
	msg := identityRefused(t, e, owner, `ALTER PUBLICATION "cdcrelay_outbox" SET (publish_via_partition_root = true)`)
	t.Logf("partitioned outbox: %d rows in 3 partitions (4 backfilled) delivered and marked; without the root: %q", len(rows), msg)
}

// TestIntegrationOutboxPublicationRefused: at start the relay refuses a
// publication that also publishes a relation of the outbox's tree (a
// child table, whose rows may be outbox rows under another name), or
// whose table no longer exists, naming the remedy; the slot does not move.
func TestIntegrationOutboxPublicationRefused(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	ctx := context.Background()
	r := e.startRelay(nil)
	r.waitStreaming(t)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, `CREATE TABLE outbox_child () INHERITS (event_outbox); ALTER PUBLICATION cdcrelay_outbox ADD TABLE outbox_child`); err != nil {
		t.Fatal(err)
	}
	identityRefused(t, e, nil, `also covers "public"."outbox_child", of the partition or inheritance tree of "public"."event_outbox"`)
	if _, err := e.db.Exec(ctx, `DROP TABLE outbox_child; DROP TABLE event_outbox`); err != nil {
		t.Fatal(err)
	}
	identityRefused(t, e, nil, `table "public"."event_outbox" does not exist`)
}

// TestIntegrationMigrateIntoSchema: `cdcrelay migrate` with
// CDCRELAY_TABLE=orders.event_outbox and the default publication creates
// orders.event_outbox and a publication of it, and no public.event_outbox;
// the relay streams it end to end. Where the default publication already
// publishes another table, migrate fails and says so.
func TestIntegrationMigrateIntoSchema(t *testing.T) {
	e := identityEnv(t, `CREATE SCHEMA orders`)
	ctx := context.Background()
	migrate := func(dbURL string) (string, error) {
		cmd := exec.Command(relayBinary(t), "migrate")
		cmd.Env = append(os.Environ(), config.Prefix+"DATABASE_URL="+dbURL, config.Prefix+"TABLE=orders.event_outbox")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for range 2 {
		if out, err := migrate(e.dbURL); err != nil {
			t.Fatalf("migrate: %v\n%s", err, out)
		}
	}
	var stray, index bool
	var published []string
	err := e.db.QueryRow(ctx, `
		SELECT to_regclass('public.event_outbox') IS NOT NULL,
		       EXISTS (SELECT 1 FROM pg_indexes WHERE schemaname = 'orders' AND indexname = 'event_outbox_unpublished_idx'),
		       ARRAY(SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = 'cdcrelay_outbox')`).
		Scan(&stray, &index, &published)
	if err != nil {
		t.Fatal(err)
	}
	if stray || !index || len(published) != 1 || published[0] != "orders.event_outbox" {
		t.Fatalf("after migrate: public.event_outbox exists %v, index %v, cdcrelay_outbox publishes %v", stray, index, published)
	}

	identityGrant(t, e, "orders", "event_outbox")
	backlog, _ := identityInsert(t, e.db, "orders.event_outbox", "id", "routing_key", "", 3)
	r := e.startRelay(map[string]string{"TABLE": "orders.event_outbox"})
	r.waitStreaming(t)
	rows, committed := identityInsert(t, e.db, "orders.event_outbox", "id", "routing_key", "", 10)
	rows = append(backlog, rows...)
	identityWaitDelivered(t, e, rows, committed, 30*time.Second)
	testenv.WaitConfirmed(t, e.db, slotName, committed, 30*time.Second)
	report(t, rows, e.consumer.Deliveries())
	identityWaitMarked(t, e.db, "orders.event_outbox", 30*time.Second)

	// Another database whose default publication publishes public.event_outbox.
	if err := e.pg.CreateDatabase(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	other, err := pgx.Connect(ctx, e.pg.URL("other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if err := migrations.Apply(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, `CREATE SCHEMA orders`); err != nil {
		t.Fatal(err)
	}
	out, err := migrate(e.pg.URL("other"))
	if err == nil || !strings.Contains(out, `publication cdcrelay_outbox does not cover "orders"."event_outbox"`) {
		t.Fatalf("migrate over a publication of another table: %v\n%s", err, out)
	}
	t.Logf("migrate into orders: no public.event_outbox, %d rows (3 backfilled) delivered and marked; over a publication of public.event_outbox: %s",
		len(rows), strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]))
}

// TestIntegrationQuotedOutbox: a quoted mixed-case table
// "Billing"."Outbox Events" with mixed-case columns and a quoted
// publication name works end to end: backlog and streamed rows are
// delivered and the janitor marks them published_at.
func TestIntegrationQuotedOutbox(t *testing.T) {
	e := identityEnv(t, `
		CREATE SCHEMA "Billing";
		CREATE TABLE "Billing"."Outbox Events" (
			"EventId" UUID PRIMARY KEY DEFAULT gen_random_uuid(),
			"RoutingKey" TEXT NOT NULL,
			payload JSONB NOT NULL,
			enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now(),
			published_at TIMESTAMPTZ,
			attempts INT NOT NULL DEFAULT 0,
			last_error TEXT);
		CREATE PUBLICATION "Billing Pub" FOR TABLE "Billing"."Outbox Events" WITH (publish = 'insert');`)
	identityGrant(t, e, "Billing", "Outbox Events")
	const table = `"Billing"."Outbox Events"`
	backlog, _ := identityInsert(t, e.db, table, `"EventId"`, `"RoutingKey"`, "", 3)
	r := e.startRelay(map[string]string{
		"TABLE": table, "PUBLICATION": `"Billing Pub"`, "ID_COLUMN": `"EventId"`, "ROUTING_KEY_COLUMN": `"RoutingKey"`,
	})
	r.waitStreaming(t)
	rows, committed := identityInsert(t, e.db, table, `"EventId"`, `"RoutingKey"`, "", 10)
	rows = append(backlog, rows...)
	identityWaitDelivered(t, e, rows, committed, 30*time.Second)
	testenv.WaitConfirmed(t, e.db, slotName, committed, 30*time.Second)
	report(t, rows, e.consumer.Deliveries())
	identityWaitMarked(t, e.db, table, 30*time.Second)
	t.Logf(`%s: %d rows (3 backfilled) delivered with message_id from "EventId" and keys from "RoutingKey", all marked published_at`, table, len(rows))
}
