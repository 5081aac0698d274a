package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/preflight"
)

// foreignStatus is the cdcrelay_status series of a slot held by a process
// that is not a relay.
const foreignStatus = `cdcrelay_status{reason="slot_foreign",slot="` + slotName + `"}`

// standbyClock is the MONITOR_INTERVAL of the tests that count a
// standby's monitor refreshes as its clock (standbyLiveFor).
const standbyClock = 100 * time.Millisecond

// standbyLiveFor waits until r, waiting as the standby, has run through d
// since the call. A standby's slot code is blocked in its one lock wait
// and sends nothing, so no counter of its own rises; its monitor
// (MONITOR_INTERVAL standbyClock, and the only relay on the database, so
// the monitor lock's holder) refreshes on the relay's own clock. A refresh
// stamped d after the call shows the process ran through the window, not
// only that the test's clock moved.
func standbyLiveFor(t *testing.T, r *running, d time.Duration) {
	t.Helper()
	const name = "cdcrelay_monitor_last_success_timestamp_seconds"
	end := float64(time.Now().Add(d).UnixNano()) / 1e9
	pollUntil(t, d+time.Minute, "a monitor refresh of the standby "+d.String()+" on", func() bool {
		v, _ := monitorValue(t, r.reg, name)
		return v >= end
	})
}

// waitSlotHolder waits until a backend with application_name app holds
// the slot, and returns its pid.
func waitSlotHolder(t *testing.T, db *pgx.Conn, app string, within time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var pid int
		err := db.QueryRow(context.Background(), `SELECT s.active_pid FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid
			WHERE s.slot_name = $1 AND a.application_name = $2`, slotName, app).Scan(&pid)
		switch {
		case err == nil:
			return pid
		case !errors.Is(err, pgx.ErrNoRows):
			t.Fatal(err)
		case time.Now().After(deadline):
			t.Fatalf("no backend of %s holds slot %s after %s", app, slotName, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitSlotFree waits until no process holds the slot.
func waitSlotFree(t *testing.T, db *pgx.Conn, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var active bool
		if err := db.QueryRow(context.Background(), `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slotName).Scan(&active); err != nil {
			t.Fatal(err)
		}
		if !active {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot %s still active after %s", slotName, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestIntegrationSlotHeldByRecvLogical: a real pg_recvlogical holds the
// relay's slot (the review's case: check said OK "another relay is
// streaming", /readyz said 200 standby and the log had one INFO line,
// while the tool confirmed the slot past events the relay would never
// publish). check reports an ERROR naming its pid and application_name
// with the remedy; the relay logs it at ERROR once (not at every retry),
// /readyz is 503 naming the holder, and cdcrelay_status{reason=
// "slot_foreign"} is 1. Once the tool is gone the relay streams.
func TestIntegrationSlotHeldByRecvLogical(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e, r := streamingRelay(t, nil)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	waitSlotFree(t, e.db, 10*time.Second)
	recv := e.pg.StartRecvLogical(t, e.dbURL, slotName, "cdcrelay_outbox")
	pid := waitSlotHolder(t, e.db, "pg_recvlogical", 10*time.Second)
	holder := fmt.Sprintf(`pid %d (application_name "pg_recvlogical"`, pid)

	var found []preflight.Finding
	for _, f := range preflight.Run(ctx, e.config(nil), preflight.Options{}) {
		if f.Check == "slot" {
			found = append(found, f)
		}
	}
	if len(found) != 1 || found[0].Severity != preflight.Error || !strings.Contains(found[0].Message, holder) ||
		!strings.Contains(found[0].Message, "not a relay") || !strings.Contains(found[0].Remedy, fmt.Sprintf("pg_terminate_backend(%d)", pid)) {
		t.Fatalf("check's slot findings %+v; want one ERROR naming %s with pg_terminate_backend(%d) as remedy", found, holder, pid)
	}

	addr := freeAddr(t)
	p := e.startProcess(map[string]string{"HTTP_ADDR": addr, "LOG_LEVEL": "info", "LOG_FORMAT": "json", "STANDBY_RETRY": "500ms"})
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := readyz(addr)
		if code == http.StatusServiceUnavailable && strings.Contains(body, holder) && strings.Contains(body, "not a relay") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz %d %q; want 503 naming %s", code, body, holder)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := scrape(t, addr)[foreignStatus]; got != 1 {
		t.Fatalf("%s = %v while pg_recvlogical holds the slot, want 1", foreignStatus, got)
	}
	// Three attempts on the slot, each retried for 5 s: one ERROR.
	attempts := func() int { return strings.Count(p.Log.String(), "slot still active for the previous holder") }
	for deadline := time.Now().Add(60 * time.Second); attempts() < 3; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d attempts on the held slot after 60 s, want 3", attempts())
		}
	}
	var errs []string
	for _, line := range strings.Split(p.Log.String(), "\n") {
		if strings.Contains(line, `"level":"ERROR"`) && strings.Contains(line, "not a relay") {
			errs = append(errs, line)
		}
	}
	if len(errs) != 1 || !strings.Contains(errs[0], fmt.Sprintf(`"holder_pid":%d`, pid)) || !strings.Contains(errs[0], `"holder_application_name":"pg_recvlogical"`) {
		t.Fatalf("ERROR lines about the holder after %d attempts: %q; want one naming pid %d and pg_recvlogical", attempts(), errs, pid)
	}

	if err := recv.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, addr, "streaming", 30*time.Second)
	if got := scrape(t, addr)[foreignStatus]; got != 0 {
		t.Fatalf("%s = %v while streaming, want 0", foreignStatus, got)
	}
	insertDelivered(t, e, 3)
}
