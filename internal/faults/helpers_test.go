// Package faults_test is cdcrelay's fault matrix: each test runs
// at least 1,000 events around one failure of PostgreSQL, the broker, the
// network between them or the relay itself, then checks from the database
// that every outbox row reached a consumer, counts duplicates and checks
// that first deliveries kept commit order. Each test logs one line
//
//	FAULT <name>: events=… lost=… duplicates=… reordered=… recover=…
//
// and, when CDCRELAY_FAULTS_REPORT names a file, appends it there as JSON;
// docs/reliability.md is filled from those lines.
//
// The quick tests run in `make test`; the slow ones carry the build tag
// `faults` and run under `make test-faults`.
package faults_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/sethvargo/go-envconfig"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/relay"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/migrations"
)

const slotName = "cdcrelay_outbox"

// cleanups run once every test has finished.
var cleanups []func()

func TestMain(m *testing.M) {
	code := m.Run()
	for _, c := range cleanups {
		c()
	}
	os.Exit(code)
}

// reportEnv names a file the tests append their figures to (JSON lines).
const reportEnv = "CDCRELAY_FAULTS_REPORT"

// worldOptions choose the services of one test.
type worldOptions struct {
	PG testenv.PostgresOptions
	// Broker is a private node; nil means the machine's shared broker.
	Broker *testenv.RabbitMQ
	// Binding is the consumer's binding key ("#" when empty).
	Binding string
	// PGProxy and AMQPProxy put a fault proxy between the relay and that
	// service. Test code (loader, consumer, checks) always goes direct.
	PGProxy, AMQPProxy bool
}

// world is one test's services: a throwaway cluster with the outbox schema,
// a broker exchange, a consumer bound to it and the optional fault proxies.
type world struct {
	t         *testing.T
	pg        *testenv.Postgres
	dbURL     string // direct
	amqpURL   string // direct
	exchange  string
	consumer  *testenv.Consumer
	db        *pgx.Conn
	pgProxy   *testenv.Proxy
	amqpProxy *testenv.Proxy
}

func newWorld(t *testing.T, o worldOptions) *world {
	t.Helper()
	var amqpURL string
	if o.Broker != nil {
		amqpURL = o.Broker.URL()
	} else {
		amqpURL = testenv.RequireAMQP(t)
	}
	pg := testenv.MustPostgres(t, o.PG)
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, pg: pg, dbURL: pg.URL("app"), amqpURL: amqpURL, exchange: testenv.UniqueName("cdcrelay.faults")}
	w.db = w.connect()
	if err := migrations.Apply(ctx, w.db); err != nil {
		t.Fatal(err)
	}
	binding := o.Binding
	if binding == "" {
		binding = "#"
	}
	w.consumer = testenv.MustConsumer(t, amqpURL, w.exchange, testenv.UniqueName("cdcrelay.faults.q"), binding)
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = testenv.DeleteExchange(cctx, amqpURL, w.exchange)
	})
	if o.PGProxy {
		w.pgProxy = testenv.MustProxy(t, fmt.Sprintf("127.0.0.1:%d", pg.Port()))
	}
	if o.AMQPProxy {
		target := "127.0.0.1:5672"
		if o.Broker != nil {
			target = o.Broker.Addr()
		} else if u, err := amqpURI(amqpURL); err == nil {
			target = u
		}
		w.amqpProxy = testenv.MustProxy(t, target)
	}
	return w
}

func amqpURI(url string) (string, error) {
	rest, ok := strings.CutPrefix(url, "amqp://")
	if !ok {
		return "", errors.New("not amqp://")
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		rest = rest[i+1:]
	}
	host, _, _ := strings.Cut(rest, "/")
	if !strings.Contains(host, ":") {
		host += ":5672"
	}
	return host, nil
}

// amqp runs fn on a channel to the test's broker (direct).
func (w *world) amqp(t *testing.T, fn func(*amqp.Channel) error) {
	t.Helper()
	_, ch := testenv.MustChannel(t, w.amqpURL)
	if err := fn(ch); err != nil {
		t.Fatal(err)
	}
}

// drain consumes and discards queue's messages until the test ends.
func (w *world) drain(t *testing.T, queue string) {
	t.Helper()
	_, ch := testenv.MustChannel(t, w.amqpURL)
	msgs, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range msgs {
		}
	}()
}

func (w *world) connect() *pgx.Conn {
	w.t.Helper()
	db, err := pgx.Connect(context.Background(), w.dbURL)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = db.Close(context.Background()) })
	return db
}

// relayDBURL is the database URL the relay uses (through the proxy if any).
func (w *world) relayDBURL() string {
	if w.pgProxy != nil {
		return fmt.Sprintf("postgres://postgres@%s/app?sslmode=disable", w.pgProxy.Addr())
	}
	return w.dbURL
}

// relayAMQPURL is the broker URL the relay uses (through the proxy if any).
func (w *world) relayAMQPURL() string {
	if w.amqpProxy != nil {
		return "amqp://guest:guest@" + w.amqpProxy.Addr() + "/"
	}
	return w.amqpURL
}

// vars is the relay's environment. Backoff is the product default (500ms
// doubling) capped at 5s instead of 30s to keep the tests short.
func (w *world) vars(extra map[string]string) map[string]string {
	v := map[string]string{
		"DATABASE_URL": w.relayDBURL(), "AMQP_URL": w.relayAMQPURL(), "EXCHANGE": w.exchange,
		"HTTP_ADDR": "127.0.0.1:0", "BACKOFF_MIN": "500ms", "BACKOFF_MAX": "5s", "LOG_LEVEL": "info",
	}
	for k, val := range extra {
		v[k] = val
	}
	return v
}

// inproc is a relay running in the test process (under -race).
type inproc struct {
	*testenv.Background
	relay *relay.Relay
	reg   *prometheus.Registry
	log   *testenv.Buffer
}

func (w *world) startRelay(extra map[string]string) *inproc {
	w.t.Helper()
	m := map[string]string{}
	for k, v := range w.vars(extra) {
		m[config.Prefix+k] = v
	}
	cfg, err := config.LoadFrom(context.Background(), envconfig.MapLookuper(m))
	if err != nil {
		w.t.Fatal(err)
	}
	level, _ := cfg.Level()
	buf := &testenv.Buffer{}
	log := slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: level}))
	reg := prometheus.NewRegistry()
	run := &inproc{reg: reg, log: buf}
	// No janitor: it marks published_at, which these tests do not check,
	// and the relay binary (startProcess) runs with one anyway.
	if run.relay, err = relay.New(cfg, nil, log, reg); err != nil {
		w.t.Fatal(err)
	}
	run.Background = testenv.Go(run.relay.Run)
	w.t.Cleanup(func() {
		if err := run.Stop(); err != nil {
			w.t.Errorf("relay: %v", err)
		}
		if w.t.Failed() {
			w.t.Logf("relay log (last 60 lines):\n%s", tail(buf.String(), 60))
		}
	})
	return run
}

func (r *inproc) waitStreaming(t *testing.T) {
	t.Helper()
	r.WaitFor(t, 30*time.Second, "streaming", r.relay.Streaming)
}

// running fails the test if the relay has exited.
func (r *inproc) running(t *testing.T) {
	t.Helper()
	if exited, err := r.Exited(); exited {
		t.Fatalf("relay exited: %v", err)
	}
}

// metric sums the values of a counter or gauge family.
func (r *inproc) metric(t *testing.T, name string) float64 {
	t.Helper()
	fams, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			}
		}
	}
	return sum
}

// failures returns the errors of the relay's "pipeline failed" log lines.
func (r *inproc) failures() []string {
	var out []string
	for _, line := range strings.Split(r.log.String(), "\n") {
		if !strings.Contains(line, "pipeline failed") {
			continue
		}
		if i := strings.Index(line, "error="); i >= 0 {
			out = append(out, line[i+len("error="):])
		}
	}
	return out
}

// transportFailuresOnly checks that a link fault was reported as one
// (docs/architecture.md invariant 3: transport failures never count as a poisoned
// event): no nack or return was counted and every failure logged says so.
func (r *inproc) transportFailuresOnly(t *testing.T) {
	t.Helper()
	if n := r.metric(t, "cdcrelay_returns_total"); n != 0 {
		t.Errorf("a broker link fault was counted as %v returned (unroutable) messages", n)
	}
	if n := r.metric(t, "cdcrelay_nacks_total"); n != 0 {
		t.Errorf("a broker link fault was counted as %v nacks", n)
	}
	for _, f := range r.failures() {
		if strings.Contains(f, "unroutable") || strings.Contains(f, "nacked") {
			t.Errorf("a link fault was reported as a broker verdict on an event: %s", f)
		}
	}
}

// restarts is the relay's pipeline restart counter.
func (r *inproc) restarts(t *testing.T) int {
	return int(r.metric(t, "cdcrelay_pipeline_restarts_total"))
}

// --- load ---

// routingKeys are rotated per transaction so the order check runs per key.
var routingKeys = []string{"ev.k0", "ev.k1", "ev.k2", "ev.k3"}

// insertSQL inserts n rows in one statement; n runs 1..n in the payload so
// the checks can match each row's index in its transaction.
const insertSQL = `
	INSERT INTO event_outbox (routing_key, payload)
	SELECT $1, jsonb_build_object('n', g, 'tx', txid_current(), 'event_type', 'TestEvent')
	FROM generate_series(1, $2) g
	RETURNING id::text`

// insertTx inserts one transaction of n rows and returns their ids.
func insertTx(ctx context.Context, db *pgx.Conn, key string, n int) ([]string, error) {
	var ids []string
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, insertSQL, key, n)
		if err != nil {
			return err
		}
		ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	return ids, err
}

// insert commits txs transactions of size rows each, rotating the routing
// keys, and returns the ids in commit order.
func (w *world) insert(t *testing.T, txs, size int) []string {
	t.Helper()
	var all []string
	for i := range txs {
		ids, err := insertTx(context.Background(), w.db, routingKeys[i%len(routingKeys)], size)
		if err != nil {
			t.Fatalf("insert: %v", err)
		}
		all = append(all, ids...)
	}
	return all
}

// ids flattens the ids of transactions.
func ids(cs []commit) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.ids...)
	}
	return out
}

// commit is one transaction the loader saw commit.
type commit struct {
	at  time.Time
	ids []string
}

// loader inserts events at a steady rate from its own connection and keeps
// going through database failures (reconnecting). A transaction whose
// COMMIT outcome is unknown (the connection died) is not recorded; the
// checks take the truth from the table, so such rows still count.
type loader struct {
	mu      sync.Mutex
	commits []commit
	events  int
	errs    []string
	done    chan struct{}
	cancel  context.CancelFunc
}

// load inserts total events in transactions of txSize at about rate events
// per second.
func (w *world) load(total, rate, txSize int) *loader {
	ctx, cancel := context.WithCancel(context.Background())
	l := &loader{done: make(chan struct{}), cancel: cancel}
	w.t.Cleanup(func() { cancel(); <-l.done })
	go func() {
		defer close(l.done)
		var db *pgx.Conn
		defer func() {
			if db != nil {
				_ = db.Close(context.Background())
			}
		}()
		interval := time.Duration(float64(time.Second) * float64(txSize) / float64(rate))
		next := time.Now()
		for i := 0; l.count() < total; i++ {
			if ctx.Err() != nil {
				return
			}
			if db == nil {
				cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
				c, err := pgx.Connect(cctx, w.dbURL)
				ccancel()
				if err != nil {
					l.fail(err)
					sleepCtx(ctx, 100*time.Millisecond)
					continue
				}
				db = c
			}
			n := min(txSize, total-l.count())
			ids, err := insertTx(ctx, db, routingKeys[i%len(routingKeys)], n)
			if err != nil {
				l.fail(err)
				_ = db.Close(context.Background())
				db = nil
				sleepCtx(ctx, 100*time.Millisecond)
				continue
			}
			l.mu.Lock()
			l.commits = append(l.commits, commit{at: time.Now(), ids: ids})
			l.events += len(ids)
			l.mu.Unlock()
			next = next.Add(interval)
			if d := time.Until(next); d > 0 {
				sleepCtx(ctx, d)
			} else if d < -time.Second {
				next = time.Now() // fell behind (an outage): do not burst
			}
		}
	}()
	return l
}

func (l *loader) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.events
}

func (l *loader) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err.Error())
}

// wait waits until the loader has committed everything.
func (l *loader) wait(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(within):
		t.Fatalf("loader: %d events committed after %s", l.count(), within)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) > 0 {
		t.Logf("loader: %d failed attempts (retried), first: %s", len(l.errs), l.errs[0])
	}
}

// since returns the transactions committed at or after t0.
func (l *loader) since(t0 time.Time) []commit {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []commit
	for _, c := range l.commits {
		if !c.at.Before(t0) {
			out = append(out, c)
		}
	}
	return out
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// --- checks ---

// outboxRow is a committed row, the ground truth.
type outboxRow struct {
	key, payload string
	n            int64
}

// outbox reads every committed outbox row.
func (w *world) outbox(t *testing.T) map[string]outboxRow {
	t.Helper()
	rows, err := w.db.Query(context.Background(), `SELECT id::text, routing_key, payload::text, (payload->>'n')::bigint FROM event_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]outboxRow{}
	for rows.Next() {
		var id string
		var r outboxRow
		if err := rows.Scan(&id, &r.key, &r.payload, &r.n); err != nil {
			t.Fatal(err)
		}
		out[id] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitAll waits until every committed outbox row has reached the consumer.
// Call it once no more rows are being inserted.
func (w *world) waitAll(t *testing.T, within time.Duration) {
	t.Helper()
	want := w.outbox(t)
	seen := make(map[string]bool, len(want))
	next := 0
	deadline := time.Now().Add(within)
	for {
		for _, d := range w.consumer.DeliveriesFrom(next) {
			next++
			if _, ok := want[d.MessageID]; ok {
				seen[d.MessageID] = true
			}
		}
		if len(seen) == len(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events delivered after %s", len(seen), len(want), within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitIDs waits until every id has reached the consumer at least once.
func (w *world) waitIDs(t *testing.T, ids []string, within time.Duration) {
	t.Helper()
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	next := 0
	deadline := time.Now().Add(within)
	for len(want) > 0 {
		for _, d := range w.consumer.DeliveriesFrom(next) {
			next++
			delete(want, d.MessageID)
		}
		if len(want) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events not delivered after %s", len(want), len(ids), within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outcome is one row of the reliability table.
type outcome struct {
	Fault      string  `json:"fault"`
	Events     int     `json:"events"`
	Lost       int     `json:"lost"`
	Duplicates int     `json:"duplicates"`
	Reordered  int     `json:"reordered"`
	RecoverSec float64 `json:"recover_s"`
	Note       string  `json:"note,omitempty"`
}

// check compares what the consumer received with the table: every row
// delivered with its identity and body, duplicates counted, first
// deliveries in commit order per routing key (by the relay's commit LSN and
// index headers, and each index matching the row's place in its
// transaction). It fails the test on any loss or reordering, logs the FAULT
// line and returns the outcome.
//
// The recovery figure is the longest wait any of the affected transactions
// had: for each, from its commit or recoverFrom, whichever is later, until
// its last event was first delivered. Under a steady load with recoverFrom
// the moment of the fault, that is the worst commit-to-delivery latency the
// fault caused; for events committed during an outage and recoverFrom the
// moment the failed side came back, it is the time to catch up.
func (w *world) check(t *testing.T, fault string, recoverFrom time.Time, affected []commit, note string) outcome {
	t.Helper()
	return w.checkRecovery(t, fault, recoverFrom, affected, -1, note)
}

// checkRecovered is check with a recovery time measured by the test.
func (w *world) checkRecovered(t *testing.T, fault string, recovery time.Duration, note string) outcome {
	t.Helper()
	return w.checkRecovery(t, fault, time.Time{}, nil, recovery, note)
}

func (w *world) checkRecovery(t *testing.T, fault string, recoverFrom time.Time, affected []commit, fixed time.Duration, note string) outcome {
	t.Helper()
	want := w.outbox(t)
	got := w.consumer.Deliveries()
	type pos struct {
		lsn   pglogrepl.LSN
		index int64
	}
	first := make(map[string]time.Time, len(want))
	lastByKey := map[string]pos{}
	var lastGlobal pos
	var dups, reordered, globalReordered int
	for i, d := range got {
		r, ok := want[d.MessageID]
		if !ok {
			t.Fatalf("delivery %d: message_id %q is not a committed outbox row", i, d.MessageID)
		}
		if d.RoutingKey != r.key || string(d.Body) != r.payload || d.DeliveryMode != 2 || d.ContentType != "application/json" {
			t.Fatalf("delivery %d (%s): key %q body %s mode %d type %q; want key %q body %s, persistent JSON",
				i, d.MessageID, d.RoutingKey, d.Body, d.DeliveryMode, d.ContentType, r.key, r.payload)
		}
		if _, seen := first[d.MessageID]; seen {
			dups++
			continue
		}
		first[d.MessageID] = d.ReceivedAt
		lsnText, _ := d.Headers[publish.HeaderCommitLSN].(string)
		lsn, err := pglogrepl.ParseLSN(lsnText)
		if err != nil {
			t.Fatalf("delivery %d: commit LSN header %v: %v", i, d.Headers[publish.HeaderCommitLSN], err)
		}
		index, ok := d.Headers[publish.HeaderTxIndex].(int64)
		if !ok {
			t.Fatalf("delivery %d: index header %#v", i, d.Headers[publish.HeaderTxIndex])
		}
		if index != r.n-1 {
			t.Fatalf("delivery %d (%s): index header %d for row %d of its transaction", i, d.MessageID, index, r.n)
		}
		p := pos{lsn, index}
		if prev, ok := lastByKey[d.RoutingKey]; ok && (p.lsn < prev.lsn || (p.lsn == prev.lsn && p.index <= prev.index)) {
			reordered++
			t.Errorf("delivery %d (%s, key %s) out of commit order: %s/%d after %s/%d", i, d.MessageID, d.RoutingKey, p.lsn, p.index, prev.lsn, prev.index)
		} else {
			lastByKey[d.RoutingKey] = p
		}
		if p.lsn < lastGlobal.lsn || (p.lsn == lastGlobal.lsn && p.index <= lastGlobal.index) {
			globalReordered++
		} else {
			lastGlobal = p
		}
	}
	var missing []string
	for id := range want {
		if _, ok := first[id]; !ok {
			missing = append(missing, id)
		}
	}
	recovery := max(fixed, 0)
	for _, c := range affected {
		from := c.at
		if from.Before(recoverFrom) {
			from = recoverFrom
		}
		for _, id := range c.ids {
			if at, ok := first[id]; ok && at.Sub(from) > recovery {
				recovery = at.Sub(from)
			}
		}
	}
	o := outcome{Fault: fault, Events: len(want), Lost: len(missing), Duplicates: dups, Reordered: reordered,
		RecoverSec: recovery.Seconds(), Note: note}
	t.Logf("FAULT %s: events=%d lost=%d duplicates=%d reordered=%d (across keys: %d) recover=%s %s",
		fault, o.Events, o.Lost, o.Duplicates, o.Reordered, globalReordered, recovery.Round(time.Millisecond), note)
	if path := os.Getenv(reportEnv); path != "" {
		appendReport(t, path, o)
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		t.Fatalf("%d of %d events never delivered, e.g. %v", len(missing), len(want), missing[:min(5, len(missing))])
	}
	if reordered > 0 {
		t.Fatalf("%d first deliveries out of commit order", reordered)
	}
	return o
}

func appendReport(t *testing.T, path string, o outcome) {
	b, _ := json.Marshal(o)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Errorf("report: %v", err)
		return
	}
	defer f.Close()
	_, _ = f.Write(append(b, '\n'))
}

// --- slot and server state ---

// commitLSN returns the commit LSN (the relay's header) of the transaction
// holding event id, from its first delivery. A slot confirmed at or below
// it has not passed that transaction: logical decoding sends again every
// transaction whose commit record is not below the confirmed position.
func (w *world) commitLSN(t *testing.T, id string) pglogrepl.LSN {
	t.Helper()
	for _, d := range w.consumer.Deliveries() {
		if d.MessageID != id {
			continue
		}
		text, _ := d.Headers[publish.HeaderCommitLSN].(string)
		lsn, err := pglogrepl.ParseLSN(text)
		if err != nil {
			t.Fatalf("commit LSN header of %s: %v", id, err)
		}
		return lsn
	}
	t.Fatalf("event %s not delivered", id)
	return 0
}

// currentLSN is the WAL insert position now: every transaction committed
// before this call ends below it.
func currentLSN(t *testing.T, db *pgx.Conn) pglogrepl.LSN {
	t.Helper()
	var lsn pglogrepl.LSN
	if err := db.QueryRow(context.Background(), `SELECT pg_current_wal_insert_lsn()`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// --- small things ---

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
