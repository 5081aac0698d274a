package relay_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/relay"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// env is one test's world: a throwaway cluster with the outbox schema, a
// broker exchange and a consumer bound to it.
type env struct {
	t        *testing.T
	pg       *testenv.Postgres
	dbURL    string // superuser, for the test's own statements
	relayURL string // the least-privilege role the relay runs as
	amqpURL  string
	exchange string
	consumer *testenv.Consumer
	db       *pgx.Conn
}

func newEnv(t *testing.T, pgOpts testenv.PostgresOptions, binding string) *env {
	t.Helper()
	return newEnvWith(t, pgOpts, "", binding)
}

// newEnvWith is newEnv with the broker at amqpURL (a private node); empty
// means the machine's shared broker.
func newEnvWith(t *testing.T, pgOpts testenv.PostgresOptions, amqpURL, binding string) *env {
	t.Helper()
	w := relaytest.NewWorld(t, relaytest.Options{PG: pgOpts, AMQPURL: amqpURL, Exchange: "cdcrelay.test", Queue: "cdcrelay.q", Binding: binding})
	e := &env{t: t, pg: w.PG, dbURL: w.DBURL, amqpURL: w.AMQPURL, exchange: w.Exchange, consumer: w.Consumer, db: w.DB}
	e.relayURL = leastPrivilegeRole(t, e.db, e.dbURL)
	return e
}

// relayRolePassword is the least-privilege role's password; the secret
// tests look for it in everything the relay prints.
const relayRolePassword = "Rel4y-pw-never-logged"

// leastPrivilegeRole creates the role docs/least-privilege.md documents
// and returns the URL to connect as it: every integration test runs the
// relay as this role, never as a superuser.
func leastPrivilegeRole(t *testing.T, db *pgx.Conn, superURL string) string {
	t.Helper()
	_, err := db.Exec(context.Background(), `
		CREATE ROLE cdcrelay_app LOGIN REPLICATION PASSWORD '`+relayRolePassword+`';
		GRANT SELECT, DELETE ON event_outbox TO cdcrelay_app;
		GRANT UPDATE (published_at, attempts, last_error) ON event_outbox TO cdcrelay_app;`)
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	u, err := url.Parse(superURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("cdcrelay_app", relayRolePassword)
	return u.String()
}

func (e *env) connect() *pgx.Conn {
	e.t.Helper()
	return relaytest.Connect(e.t, e.dbURL)
}

// vars is the relay's environment for this test: short backoff, debug logs.
func (e *env) vars(extra map[string]string) map[string]string {
	return relaytest.Vars(e.relayURL, e.amqpURL, e.exchange,
		map[string]string{"BACKOFF_MIN": "100ms", "BACKOFF_MAX": "1s", "LOG_LEVEL": "debug"}, extra)
}

func (e *env) config(extra map[string]string) config.Config {
	e.t.Helper()
	return relaytest.Config(e.t, e.vars(extra))
}

// running is an in-process relay service (relay, janitor, monitor); relay,
// reg and logs name the kit's fields the way these tests use them.
type running struct {
	*relaytest.InProcess
	relay *relay.Relay
	reg   *prometheus.Registry
	logs  *testenv.Buffer // everything the relay logged
}

// startRelay runs the service in this process until the test ends or stop.
func (e *env) startRelay(extra map[string]string) *running {
	e.t.Helper()
	p := relaytest.Start(e.t, e.config(extra), relaytest.InProcessOptions{Level: slog.LevelDebug, LogTo: testWriter{e.t}})
	run := &running{InProcess: p, relay: p.Relay, reg: p.Reg, logs: p.Logs}
	e.t.Cleanup(func() { _ = run.stop(e.t) })
	return run
}

// stop asks for a graceful stop and returns Run's result once the janitor
// has flushed too.
func (r *running) stop(t *testing.T) error {
	err := r.Stop()
	if errors.Is(err, testenv.ErrStillRunning) {
		t.Fatalf("relay: %v", err)
	}
	return err
}

func (r *running) waitStreaming(t *testing.T) {
	t.Helper()
	r.WaitStreaming(t)
}

// testWriter sends relay logs to the test log, shown on failure or -v.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// row is an inserted outbox row.
type row struct {
	id, key, payload string
}

// insertTxns inserts one transaction per size, each row with a unique
// payload, and returns the rows in insertion order and the WAL insert
// position read inside the last transaction (its commit lies past it).
func insertTxns(t *testing.T, db *pgx.Conn, key string, sizes ...int) ([]row, pglogrepl.LSN) {
	t.Helper()
	rows, last, err := insert(context.Background(), db, key, sizes...)
	if err != nil {
		t.Fatalf("insert: %v", err)
	}
	return rows, last
}

// insert is insertTxns for goroutines other than the test's.
func insert(ctx context.Context, db *pgx.Conn, key string, sizes ...int) ([]row, pglogrepl.LSN, error) {
	var rows []row
	var last pglogrepl.LSN
	for _, n := range sizes {
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			inserted, err := relaytest.Insert(ctx, tx, key, n)
			if err != nil {
				return err
			}
			for _, r := range inserted {
				rows = append(rows, row{r.ID, r.Key, r.Payload})
			}
			return tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()`).Scan(&last)
		})
		if err != nil {
			return rows, last, err
		}
	}
	return rows, last, nil
}

// report checks that every row arrived with the right identity and body,
// and that first deliveries follow commit order (by the relay's commit LSN
// and index headers). It returns the number of duplicates.
func report(t *testing.T, rows []row, got []testenv.Delivery) (duplicates int) {
	t.Helper()
	return reportOrder(t, rows, got, func(testenv.Delivery) string { return "" })
}

// reportOrder is report with commit order checked within each group that
// orderKey names (report: one group; partitioned publishing: one per
// routing key).
func reportOrder(t *testing.T, rows []row, got []testenv.Delivery, orderKey func(testenv.Delivery) string) (duplicates int) {
	t.Helper()
	want := make(map[string]row, len(rows))
	for _, r := range rows {
		want[r.id] = r
	}
	seen := make(map[string]bool, len(got))
	prevs := map[string]relaytest.Position{}
	for i, d := range got {
		r, ok := want[d.MessageID]
		if !ok {
			t.Fatalf("delivery %d: unknown message_id %q", i, d.MessageID)
		}
		if d.RoutingKey != r.key || string(d.Body) != r.payload {
			t.Fatalf("delivery %d (%s): routing key %q body %s; want %q %s", i, d.MessageID, d.RoutingKey, d.Body, r.key, r.payload)
		}
		if d.DeliveryMode != 2 || d.ContentType != "application/json" || d.Type != "TestEvent" {
			t.Fatalf("delivery %d: mode %d content type %q type %q", i, d.DeliveryMode, d.ContentType, d.Type)
		}
		if seen[d.MessageID] {
			duplicates++
			continue
		}
		seen[d.MessageID] = true
		p, err := relaytest.PositionOf(d)
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
		group := orderKey(d)
		if prev, ok := prevs[group]; ok && !p.After(prev) {
			t.Fatalf("delivery %d out of commit order: %s/%d after %s/%d", i, p.LSN, p.Index, prev.LSN, prev.Index)
		}
		prevs[group] = p
	}
	var missing []string
	for id := range want {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		t.Fatalf("%d of %d events missing, e.g. %v", len(missing), len(rows), missing[:min(5, len(missing))])
	}
	return duplicates
}

// builds holds the relay binary the process tests run; TestMain removes it.
var builds testenv.Builds

// relayBinary is cmd/cdcrelay built with -race, once per test run.
func relayBinary(t *testing.T) string {
	t.Helper()
	return builds.Relay(t, true, "")
}

// startProcess runs the relay binary with this test's environment.
func (e *env) startProcess(extra map[string]string) *testenv.Process {
	e.t.Helper()
	return testenv.StartProcess(e.t, relayBinary(e.t), relaytest.Environ(e.vars(extra)), "run")
}

func isExit(err error, code int) bool {
	var ee *exec.ExitError
	if code == 0 {
		return err == nil
	}
	return errors.As(err, &ee) && ee.ExitCode() == code
}

func pglsn(v uint64) pglogrepl.LSN { return pglogrepl.LSN(v) }

// waitAll waits until every row has been delivered at least once.
func waitAll(t *testing.T, c *testenv.Consumer, rows []row, within time.Duration) {
	t.Helper()
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.id
	}
	waitDeliveredIDs(t, c, ids, within, func() { report(t, rows, c.Deliveries()) })
}

// waitDeliveredIDs waits until every id has been delivered at least once. On
// timeout it calls onTimeout, if not nil, to explain, then fails.
func waitDeliveredIDs(t *testing.T, c *testenv.Consumer, ids []string, within time.Duration, onTimeout func()) {
	t.Helper()
	relaytest.WaitDelivered(t, c, ids, within, onTimeout)
}

// streamingRelay starts a relay with vars on a fresh database and waits until
// it streams.
func streamingRelay(t *testing.T, vars map[string]string) (*env, *running) {
	t.Helper()
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	r := e.startRelay(vars)
	r.waitStreaming(t)
	return e, r
}

// insertMarked inserts n rows in one transaction and waits until they are
// delivered and marked (within markWithin): the janitor's connection is
// then open.
func insertMarked(t *testing.T, e *env, n int, markWithin time.Duration) []row {
	t.Helper()
	rows, _ := insertDelivered(t, e, n)
	waitMarked(t, e, rows, markWithin)
	return rows
}

// marksDelivered inserts one transaction per size and waits (30 s) until
// every row is delivered; it returns the rows and the position read
// inside the last transaction.
func insertDelivered(t *testing.T, e *env, sizes ...int) ([]row, pglogrepl.LSN) {
	t.Helper()
	rows, last := insertTxns(t, e.db, "k", sizes...)
	waitAll(t, e.consumer, rows, 30*time.Second)
	return rows, last
}

// marksCommitLSN is the commit LSN header of the first delivery of id.
func marksCommitLSN(t *testing.T, e *env, id string) pglogrepl.LSN {
	t.Helper()
	return relaytest.CommitLSN(t, e.consumer, id)
}

// restartPostgres starts the stopped server again and reconnects the
// test's own connection.
func restartPostgres(t *testing.T, e *env) {
	t.Helper()
	if err := e.pg.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.db = e.connect()
}

// waitReturnedUntilRouted checks that the slot has not passed the unrouted
// (returned) rows committed before last, then binds a queue to their
// routing key "nowhere" and waits until the retried message arrives there
// and the slot passes it.
func waitReturnedUntilRouted(t *testing.T, e *env, unrouted []row, last pglogrepl.LSN) {
	t.Helper()
	if got := testenv.ConfirmedFlush(t, e.db, slotName); got > last {
		t.Fatalf("slot moved to %s past the returned message (%s)", got, last)
	}
	late := testenv.MustConsumer(t, e.amqpURL, e.exchange, testenv.UniqueName("cdcrelay.late"), "nowhere")
	testenv.WaitCount(t, late, 1, 30*time.Second)
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	report(t, unrouted, late.Deliveries()[:1])
}
