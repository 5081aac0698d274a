//go:build alerts

package alertlive_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// builds holds the relay binary; TestMain removes it.
var builds testenv.Builds

func TestMain(m *testing.M) { builds.Main(m) }

// world is the test's services: a throwaway PostgreSQL with the outbox,
// an exchange of its own on the shared broker with a queue counting what
// reaches it, a fault proxy between the relay and the broker, and the
// relay binary streaming slot.
type world struct {
	slot      string
	db        *pgx.Conn
	consumer  *testenv.Consumer
	proxy     *testenv.Proxy
	relay     *testenv.Process
	relayAddr string // host:port of the relay's /metrics
}

func newWorld(t *testing.T, slot string) *world {
	t.Helper()
	rw := relaytest.NewWorld(t, relaytest.Options{Exchange: "cdcrelay_alertlive", Queue: "cdcrelay_alertlive_q"})
	w := &world{slot: slot, db: rw.DB, consumer: rw.Consumer}
	w.proxy = testenv.MustProxy(t, relaytest.BrokerHostPort(t, rw.AMQPURL))
	w.startRelay(t, rw.DBURL, rw.Exchange)
	return w
}

// startRelay runs the relay binary (built without -race: the test is
// about what Prometheus sees, and the race build would slow a shared
// machine) through the proxy. The monitor refreshes every second so its
// gauges are never near the test's monitorStale threshold while it works.
func (w *world) startRelay(t *testing.T, dbURL, exchange string) {
	t.Helper()
	w.relayAddr = "127.0.0.1:" + strconv.Itoa(freePort(t))
	vars := map[string]string{
		"DATABASE_URL": dbURL, "AMQP_URL": "amqp://guest:guest@" + w.proxy.Addr() + "/",
		"EXCHANGE": exchange, "SLOT": w.slot, "HTTP_ADDR": w.relayAddr,
		"BACKOFF_MIN": "200ms", "BACKOFF_MAX": "2s", "MONITOR_INTERVAL": "1s", "LOG_LEVEL": "info",
	}
	w.relay = testenv.StartProcess(t, builds.Relay(t, false, ""), relaytest.Environ(vars), "run")
	deadline := time.Now().Add(time.Minute)
	for !w.serving() {
		if exited, err := w.relay.Exited(); exited {
			t.Fatalf("relay exited: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("relay's /metrics not answering after a minute")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (w *world) serving() bool {
	resp, err := http.Get("http://" + w.relayAddr + "/metrics")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// running fails the test if the relay has exited.
func (w *world) running(t *testing.T) {
	t.Helper()
	if exited, err := w.relay.Exited(); exited {
		t.Fatalf("relay exited: %v", err)
	}
}

// insert commits n outbox rows in one transaction and returns their ids.
func (w *world) insert(t *testing.T, n int) []string {
	t.Helper()
	rows, err := w.db.Query(context.Background(), `
		INSERT INTO event_outbox (routing_key, payload)
		SELECT 'alertlive.event', jsonb_build_object('n', g) FROM generate_series(1, $1) g
		RETURNING id::text`, n)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// delivered counts how many of ids reached the queue.
func (w *world) delivered(ids []string) int {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	n := 0
	for _, d := range w.consumer.Deliveries() {
		if want[d.MessageID] {
			delete(want, d.MessageID)
			n++
		}
	}
	return n
}

// waitDelivered waits until every one of ids has reached the queue.
func (w *world) waitDelivered(t *testing.T, ids []string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for w.delivered(ids) < len(ids) {
		w.running(t)
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events delivered after %s", w.delivered(ids), len(ids), within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
