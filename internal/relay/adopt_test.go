package relay_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// backlog inserts n unpublished rows in transactions of 1,000, as a polling
// drainer leaves them behind, and returns them.
func backlog(t *testing.T, db *pgx.Conn, key string, n int) []row {
	t.Helper()
	sizes := make([]int, 0, n/1000+1)
	for left := n; left > 0; left -= 1000 {
		sizes = append(sizes, min(left, 1000))
	}
	rows, _ := insertTxns(t, db, key, sizes...)
	return rows
}

// keepInserting inserts small transactions until stop is closed and
// returns what it inserted.
func keepInserting(t *testing.T, e *env, key string, stop <-chan struct{}) <-chan []row {
	return produce(t, e, key, 5, 5*time.Millisecond, stop)
}

// produce inserts transactions of rows rows, pause apart, on a connection
// of its own until stop is closed, and returns what it inserted.
func produce(t *testing.T, e *env, key string, rows int, pause time.Duration, stop <-chan struct{}) <-chan []row {
	db := e.connect()
	out := make(chan []row, 1)
	go func() {
		var all []row
		defer func() { out <- all }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			rs, _, err := insert(context.Background(), db, key, rows)
			if err != nil {
				t.Errorf("insert: %v", err)
				return
			}
			all = append(all, rs...)
			time.Sleep(pause)
		}
	}()
	return out
}

// TestIntegrationAdoptionWithoutGap: a database with 20,000 rows a retired
// polling drainer left unpublished, and inserts running while the relay
// starts: every row arrives, and every row ends marked.
func TestIntegrationAdoptionWithoutGap(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	old := backlog(t, e.db, "backlog", 20000)
	// A row the drainer had already published is not published again.
	if _, err := e.db.Exec(context.Background(), `INSERT INTO event_outbox (routing_key, payload, published_at) VALUES ('done', '{}', now())`); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	during := keepInserting(t, e, "live", stop)
	r := e.startRelay(nil)
	waitAll(t, e.consumer, old, 2*time.Minute)
	close(stop)
	live := <-during
	all := append(append([]row(nil), old...), live...)
	waitAll(t, e.consumer, all, time.Minute)
	r.waitStreaming(t)
	waitMarked(t, e, all, 30*time.Second)
	for _, d := range e.consumer.Deliveries() {
		if d.RoutingKey == "done" {
			t.Fatal("a row already marked published was published again")
		}
	}
	dups := report(t, all, e.consumer.Deliveries())
	t.Logf("adoption: %d backlog rows + %d inserted during adoption, 0 missing, %d duplicates", len(old), len(live), dups)
	if n := gauge(t, r.reg, "cdcrelay_backfill_events_total"); n < float64(len(old)) {
		t.Fatalf("backfill counter %v, want at least %d", n, len(old))
	}
	// The backlog counted in the snapshot (the drainer's rows, and the live
	// ones committed before the slot), all of it confirmed.
	total, done := gauge(t, r.reg, "cdcrelay_backfill_rows"), gauge(t, r.reg, "cdcrelay_backfill_rows_done")
	if total < float64(len(old)) || total > float64(len(all)) || done != total || gauge(t, r.reg, "cdcrelay_backfill_running") != 0 {
		t.Fatalf("backfill rows %v, done %v, running %v: want between %d and %d, all done, not running", total, done, gauge(t, r.reg, "cdcrelay_backfill_running"), len(old), len(all))
	}
}

// TestIntegrationAdoptionInterrupted kills the relay in the middle of
// publishing the backlog: the next start sees the marker, recreates the
// slot and publishes what is left; nothing is lost.
func TestIntegrationAdoptionInterrupted(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	old := backlog(t, e.db, "backlog", 20000)
	p := e.startProcess(map[string]string{"MAX_IN_FLIGHT": "50"})
	testenv.WaitCount(t, e.consumer, 2000, time.Minute)
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.Wait(t, 10*time.Second)
	if got := e.consumer.Count(); got >= len(old) {
		t.Fatalf("the backlog was done (%d deliveries) before the kill; the test did not interrupt it", got)
	}
	late, _ := insertTxns(t, e.db, "late", 10)
	all := append(append([]row(nil), old...), late...)
	p = e.startProcess(nil)
	waitAll(t, e.consumer, all, 2*time.Minute)
	waitMarked(t, e, all, 30*time.Second)
	if !strings.Contains(p.Log.String(), "adoption of this slot was interrupted") {
		t.Fatalf("restart did not report the interrupted adoption:\n%s", p.Log.String())
	}
	dups := report(t, all, e.consumer.Deliveries())
	t.Logf("adoption killed after ~2000 of %d: 0 missing, %d duplicates", len(old), dups)
}

// TestIntegrationSlotDroppedWhileDown: a slot dropped while the relay was
// down is recreated, and rows committed meanwhile come from its snapshot.
func TestIntegrationSlotDroppedWhileDown(t *testing.T) {
	e, r := streamingRelay(t, nil)
	first := insertMarked(t, e, 10, 10*time.Second)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	gap, _ := insertTxns(t, e.db, "k", 100)
	// The walsender exits a moment after the relay closes its connection.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := e.db.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slotName)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.startRelay(nil)
	waitAll(t, e.consumer, append(append([]row(nil), first...), gap...), 30*time.Second)
}

// lostCluster is a cluster whose slot can be invalidated quickly.
var lostCluster = testenv.PostgresOptions{Settings: map[string]string{
	"max_slot_wal_keep_size": "32MB", "max_wal_size": "64MB", "min_wal_size": "32MB",
}}

// invalidate generates WAL past max_slot_wal_keep_size while no relay runs
// and checkpoints until the slot reports wal_status = lost.
func invalidate(t *testing.T, db *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS filler (v text)`); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		var status *string
		if err := db.QueryRow(ctx, `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, slotName).Scan(&status); err != nil {
			t.Fatal(err)
		}
		if status != nil && *status == "lost" {
			return
		}
		if i == 20 {
			t.Fatalf("slot not invalidated (wal_status %v)", *status)
		}
		_, err := db.Exec(ctx, `INSERT INTO filler SELECT repeat(md5(g::text), 30) FROM generate_series(1, 20000) g; SELECT pg_switch_wal(); CHECKPOINT`)
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestIntegrationSlotLostRecreated: a slot invalidated by
// max_slot_wal_keep_size while the relay was down is detected, reported
// (log and metric) and recreated with a backfill, so the rows committed
// while it was down still arrive.
func TestIntegrationSlotLostRecreated(t *testing.T) {
	e := newEnv(t, lostCluster, "#")
	r := e.startRelay(nil)
	r.waitStreaming(t)
	first := insertMarked(t, e, 5, 10*time.Second)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	stranded, _ := insertTxns(t, e.db, "k", 50)
	invalidate(t, e.db)

	r = e.startRelay(nil)
	all := append(append([]row(nil), first...), stranded...)
	waitAll(t, e.consumer, all, time.Minute)
	r.waitStreaming(t)
	if n := gauge(t, r.reg, "cdcrelay_slot_lost_total"); n != 1 {
		t.Fatalf("slot lost counter %v, want 1", n)
	}
	after, _ := insertDelivered(t, e, 5)
	report(t, append(all, after...), e.consumer.Deliveries())
}

// TestIntegrationSlotLostStop: with CDCRELAY_SLOT_LOST=stop the relay
// refuses to go on and leaves the slot for an operator.
func TestIntegrationSlotLostStop(t *testing.T) {
	e := newEnv(t, lostCluster, "#")
	r := e.startRelay(nil)
	r.waitStreaming(t)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	invalidate(t, e.db)
	r = e.startRelay(map[string]string{"SLOT_LOST": "stop"})
	err := r.Wait(t, 30*time.Second, "the relay to stop after a lost slot with SLOT_LOST=stop")
	if !errors.Is(err, slot.ErrSlotLost) {
		t.Fatalf("relay ended with %v, want ErrSlotLost", err)
	}
	var status string
	if err := e.db.QueryRow(context.Background(), `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, slotName).Scan(&status); err != nil || status != "lost" {
		t.Fatalf("slot wal_status %q (%v), want it left as lost", status, err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func readyz(addr string) (int, string) { return readyzLike(addr, "/readyz") }

// readyzLike GETs path, returning the status and trimmed body (0 and the
// error text when the request fails).
func readyzLike(addr, path string) (int, string) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func waitReady(t *testing.T, addr, want string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		code, body := readyz(addr)
		if code == http.StatusOK && body == want {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("/readyz on %s: %d %q, want 200 %q after %s", addr, code, body, want, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestIntegrationHotStandby: two relays on one slot; one streams, the other
// waits and reports standby; SIGKILL the first under load and the second
// takes over within seconds with nothing lost.
func TestIntegrationHotStandby(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	addrA, addrB := freeAddr(t), freeAddr(t)
	a := e.startProcess(map[string]string{"HTTP_ADDR": addrA})
	waitReady(t, addrA, "streaming", 30*time.Second)
	e.startProcess(map[string]string{"HTTP_ADDR": addrB, "STANDBY_RETRY": "500ms"})
	waitReady(t, addrB, "standby", 30*time.Second)

	stop := make(chan struct{})
	during := keepInserting(t, e, "ha", stop)
	testenv.WaitCount(t, e.consumer, 200, 30*time.Second)
	if err := a.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	took := waitReady(t, addrB, "streaming", 30*time.Second)
	time.Sleep(500 * time.Millisecond)
	close(stop)
	rows := <-during
	waitAll(t, e.consumer, rows, time.Minute)
	dups := report(t, rows, e.consumer.Deliveries())
	t.Logf("standby took over %s after SIGKILL (readyz poll %s); %d events, 0 missing, %d duplicates",
		time.Since(killed).Round(time.Millisecond), took.Round(time.Millisecond), len(rows), dups)
}
