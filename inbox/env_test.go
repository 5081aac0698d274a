package inbox_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/inbox"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// env is one integration test's services: a throwaway database with the
// ledger and an effects table, and a queue of its own on the local broker
// whose dead-letter queue is dlq.
type env struct {
	dbURL, amqpURL string
	conn           *pgx.Conn // the test's own queries
	exchange       string    // a topic exchange bound to queue with #
	queue, dlq     string
	ch             *amqp.Channel // for publishing and inspecting queues
}

func setup(t *testing.T) *env {
	t.Helper()
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	ctx := t.Context()
	if err := pg.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	e := &env{dbURL: pg.URL("app"), amqpURL: testenv.RequireAMQP(t)}
	e.conn = e.connect(t)
	if err := inbox.Migrate(ctx, e.conn); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, e.conn); err != nil {
		t.Fatalf("Migrate is not idempotent: %v", err)
	}
	// No unique constraint: an effect applied twice shows as two rows.
	if _, err := e.conn.Exec(ctx, `CREATE TABLE effects (message_id TEXT NOT NULL, attempt INT NOT NULL,
		at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	_, e.ch = testenv.MustChannel(t, e.amqpURL)
	e.queue, e.dlq = testenv.UniqueName("inbox_test"), testenv.UniqueName("inbox_test_dlq")
	if _, err := e.ch.QueueDeclare(e.dlq, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ch.QueueDeclare(e.queue, true, false, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": e.dlq,
	}); err != nil {
		t.Fatal(err)
	}
	e.exchange = testenv.UniqueName("inbox_test")
	if err := e.ch.ExchangeDeclare(e.exchange, amqp.ExchangeTopic, false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.ch.QueueBind(e.queue, "#", e.exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := testenv.DeleteExchange(ctx, e.amqpURL, e.exchange); err != nil {
			t.Logf("delete exchange: %v", err)
		}
		for _, q := range []string{e.queue, e.dlq} {
			if err := testenv.DeleteQueue(ctx, e.amqpURL, q); err != nil {
				t.Logf("delete queue: %v", err)
			}
		}
	})
	return e
}

// publish sends a persistent message with routingKey through the test's
// exchange to its queue as the relay would: message_id and the ordering
// headers (lsn "" leaves them out).
func (e *env) publish(t *testing.T, id, routingKey, lsn string, index int64) {
	t.Helper()
	h := amqp.Table{}
	if lsn != "" {
		h[inbox.HeaderCommitLSN], h[inbox.HeaderTxIndex] = lsn, index
	}
	if err := e.ch.PublishWithContext(t.Context(), e.exchange, routingKey, true, false, amqp.Publishing{
		MessageId: id, Headers: h, DeliveryMode: amqp.Persistent, ContentType: "application/json",
		Body: []byte(fmt.Sprintf(`{"id":%q}`, id)),
	}); err != nil {
		t.Fatal(err)
	}
}

// consume opens a connection of its own and consumes the queue with manual
// acks; closing the connection makes the broker requeue what it holds.
func (e *env) consume(t *testing.T, prefetch int) (*amqp.Connection, <-chan amqp.Delivery) {
	t.Helper()
	conn, ch := testenv.MustChannel(t, e.amqpURL)
	if err := ch.Qos(prefetch, 0, false); err != nil {
		t.Fatal(err)
	}
	msgs, err := ch.Consume(e.queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return conn, msgs
}

// next waits for a delivery.
func next(t *testing.T, msgs <-chan amqp.Delivery) amqp.Delivery {
	t.Helper()
	select {
	case d, ok := <-msgs:
		if !ok {
			t.Fatal("delivery channel closed")
		}
		return d
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery within 30 s")
	}
	return amqp.Delivery{}
}

// messages is the number of ready messages in queue.
func (e *env) messages(t *testing.T, queue string) int {
	t.Helper()
	q, err := e.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// effects counts the effect rows per message id.
func (e *env) effects(t *testing.T) map[string]int {
	t.Helper()
	rows, err := e.conn.Query(t.Context(), `SELECT message_id, count(*) FROM effects GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// counter sums a counter family over its series (0 when absent).
func counter(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	f := testenv.Family(t, g, name)
	if f == nil {
		return 0
	}
	sum := 0.0
	for _, m := range f.GetMetric() {
		sum += testenv.Value(m)
	}
	return sum
}

// connect opens a connection to the test's database for the test.
func (e *env) connect(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// newInbox is an Inbox on a connection of its own (a consumer), with its
// own registry.
func newInbox(t *testing.T, e *env, lease time.Duration) (*inbox.Inbox, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	ib, err := inbox.New(e.connect(t), inbox.Options{Registerer: reg, Lease: lease, PollInterval: 100 * time.Millisecond,
		Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return ib, reg
}

// waitFor polls cond until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// childEnv names the environment of a consumer child process (child_test.go).
func childEnv(e *env, mode, crashOn string, lease time.Duration, effectsFile string) []string {
	return append(os.Environ(),
		childMarker+"=1",
		"INBOX_CHILD_DB="+e.dbURL,
		"INBOX_CHILD_AMQP="+e.amqpURL,
		"INBOX_CHILD_QUEUE="+e.queue,
		"INBOX_CHILD_MODE="+mode,
		"INBOX_CHILD_CRASH_ON="+crashOn,
		"INBOX_CHILD_LEASE="+strconv.FormatInt(lease.Milliseconds(), 10),
		"INBOX_CHILD_EFFECTS_FILE="+effectsFile,
	)
}

// fileLines is the lines of a file, none when it does not exist.
func fileLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(strings.TrimSpace(string(b)))
}
