package relay_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationByteBudgetBoundsMemory commits 300 rows of 512 KiB while
// the broker link is held, with a 1 MiB byte budget: the relay may hold no
// more than the budget of decoded events (plus the one it is waiting to
// send and the receive buffer), so its peak RSS (VmHWM) stays under 64 MiB
// where an event-counted buffer held 256 of them (128 MiB). Once the link
// is released every row arrives. The binary is built without -race, whose
// shadow memory would swamp the figure.
func TestIntegrationByteBudgetBoundsMemory(t *testing.T) {
	const peakLimit = 64 << 10 // KiB
	peak := memoryBudgetHeld(t, map[string]string{"MAX_IN_FLIGHT_BYTES": "1MiB"}, 300, 512<<10)
	if peak > peakLimit {
		t.Fatalf("peak RSS %d MiB with a 1 MiB byte budget, above %d MiB: decoded events are not bounded by bytes", peak>>10, peakLimit>>10)
	}
}

// TestIntegrationDefaultLimitsFitTheChart: with the default byte budget
// and message size limit, rows just under the limit committed while the
// broker link is held keep the relay well inside the Helm chart's 256 MiB
// memory limit (the relation is in docs/operations.md, "Memory").
func TestIntegrationDefaultLimitsFitTheChart(t *testing.T) {
	const peakLimit = 160 << 10 // KiB: 256 MiB less a wide margin
	peak := memoryBudgetHeld(t, map[string]string{}, 12, 15<<20)
	if peak > peakLimit {
		t.Fatalf("peak RSS %d MiB with the default limits, above %d MiB", peak>>10, peakLimit>>10)
	}
}

// memoryBudgetHeld runs the relay binary with extra settings, commits n
// rows of about size bytes while the broker link is held, waits, releases
// the link, checks every row arrives and returns the relay's peak RSS
// (VmHWM) in KiB.
func memoryBudgetHeld(t *testing.T, extra map[string]string, n, size int) int64 {
	t.Helper()
	e := newEnv(t, testenv.PostgresOptions{}, "mem.#")
	proxy := testenv.MustProxy(t, testenv.AMQPAddr())
	addr := freeAddr(t)
	vars := map[string]string{"AMQP_URL": "amqp://guest:guest@" + proxy.Addr() + "/", "AMQP_HEARTBEAT": "120s", "LOG_LEVEL": "info",
		"HTTP_ADDR": addr, "STATUS_INTERVAL": memoryBudgetStatuses.String()}
	for k, v := range extra {
		vars[k] = v
	}
	p := memoryBudgetProcess(t, e, vars)
	pid := p.Cmd.Process.Pid
	testenv.WaitSlotActive(t, e.db, slotName, 30*time.Second)
	time.Sleep(time.Second) // let the relay settle before the baseline
	baseline, _ := memoryBudgetRSS(t, pid)

	proxy.HoldUpstream(true)
	ids := memoryBudgetInsert(t, e, n, size)
	// Give the relay time to decode all it would: the WAL is there to read.
	memoryBudgetLiveFor(t, addr, 5*time.Second)
	heldRSS, heldPeak := memoryBudgetRSS(t, pid)
	if got := e.consumer.Count(); got > 0 {
		t.Fatalf("%d events delivered while the broker link was held", got)
	}
	proxy.HoldUpstream(false)
	began := time.Now()
	waitDeliveredIDs(t, e.consumer, ids, 3*time.Minute, nil)
	drained := time.Since(began)
	_, peak := memoryBudgetRSS(t, pid)
	if exited, err := p.Exited(); exited {
		t.Fatalf("relay exited: %v", err)
	}
	t.Logf("settings %v: RSS before the rows %d MiB; broker held: RSS %d MiB, peak (VmHWM) %d MiB; after %d rows of %d KiB drained in %s: peak %d MiB",
		extra, baseline>>10, heldRSS>>10, heldPeak>>10, len(ids), size>>10, drained.Round(100*time.Millisecond), peak>>10)
	return peak
}

// memoryBudgetStatuses is the STATUS_INTERVAL of the memory tests. Not
// statusesFast: the relay presumes a replication connection dead after
// three intervals of silence, and a walsender decoding rows of 15 MiB on
// a loaded machine can be silent for longer than 300 ms.
const memoryBudgetStatuses = 2 * time.Second

// memoryBudgetLiveFor waits until the relay process serving /metrics on
// addr has decoded an event and sent enough standby status updates
// (STATUS_INTERVAL memoryBudgetStatuses) to have run through d since the
// call, and d has passed: the reader sends them all along while it waits
// for room in the byte budget, so they show it was decoding through the
// window, not only that the test's clock moved.
func memoryBudgetLiveFor(t *testing.T, addr string, d time.Duration) {
	t.Helper()
	const decoded, statuses = "cdcrelay_events_decoded_total", "cdcrelay_status_updates_total"
	start := time.Now()
	want := scrape(t, addr)[statuses] + float64(d/memoryBudgetStatuses) + 1
	// d too: an update the server asked for comes early.
	for m := scrape(t, addr); m[decoded] < 1 || m[statuses] < want || time.Since(start) < d; m = scrape(t, addr) {
		if time.Since(start) > d+2*time.Minute {
			t.Fatalf("after %s: %v events decoded, %v status updates; want at least 1 and %v", time.Since(start), m[decoded], m[statuses], want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// memoryBudgetProcess runs the relay binary built without -race.
func memoryBudgetProcess(t *testing.T, e *env, extra map[string]string) *testenv.Process {
	t.Helper()
	env := os.Environ()
	for k, v := range e.vars(extra) {
		env = append(env, config.Prefix+k+"="+v)
	}
	return testenv.StartProcess(t, builds.Relay(t, false, ""), env, "run")
}

// memoryBudgetInsert commits n rows of about size bytes each, up to ten
// per transaction, and returns their ids.
func memoryBudgetInsert(t *testing.T, e *env, n, size int) []string {
	t.Helper()
	var ids []string
	for len(ids) < n {
		r, err := e.db.Query(context.Background(), `
			INSERT INTO event_outbox (routing_key, payload)
			SELECT 'mem.k', jsonb_build_object('event_type', 'TestEvent', 'n', g, 'pad', repeat(md5(g::text), $1 / 32))
			FROM generate_series(1, $2) g RETURNING id::text`, size, min(10, n-len(ids)))
		if err != nil {
			t.Fatal(err)
		}
		for r.Next() {
			var id string
			if err := r.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// memoryBudgetRSS reads VmRSS and VmHWM (peak) of pid, in KiB.
func memoryBudgetRSS(t *testing.T, pid int) (rss, peak int64) {
	t.Helper()
	rss, peak, err := testenv.Memory(pid)
	if err != nil {
		t.Fatal(err)
	}
	return rss, peak
}

// TestIntegrationLargeRowMemory measures what one large row costs the
// relay, with the default limits: a row just under
// CDCRELAY_MAX_MESSAGE_BYTES is received, copied out and published; a row
// four times the limit is judged poison straight from the receive buffer,
// never copied, so it costs about its size once, not twice.
func TestIntegrationLargeRowMemory(t *testing.T) {
	const (
		mib   = 1 << 20
		limit = 16 * mib
		big   = 4 * limit
	)
	e := newEnv(t, testenv.PostgresOptions{}, "mem.#")
	p := memoryBudgetProcess(t, e, map[string]string{"LOG_LEVEL": "info", "MAX_MESSAGE_BYTES": "16MiB"})
	pid := p.Cmd.Process.Pid
	testenv.WaitSlotActive(t, e.db, slotName, 30*time.Second)
	time.Sleep(time.Second)
	baseline, _ := memoryBudgetRSS(t, pid)

	insertLarge := func(size int) string {
		t.Helper()
		var id string
		err := e.db.QueryRow(context.Background(), `
			INSERT INTO event_outbox (routing_key, payload)
			SELECT 'mem.k', jsonb_build_object('event_type', 'TestEvent', 'pad', string_agg(md5(g::text), '')) FROM generate_series(1, $1 / 32) g
			RETURNING id::text`, size).Scan(&id)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	// A row far above the limit is parked without a copy.
	id := insertLarge(big)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var attempts int
		if err := e.db.QueryRow(context.Background(), `SELECT attempts FROM event_outbox WHERE id = $1::uuid`, id).Scan(&attempts); err != nil {
			t.Fatal(err)
		}
		if attempts == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the oversize row was not parked")
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, parkedPeak := memoryBudgetRSS(t, pid)

	// A row just under the limit is published: received and copied.
	waitDeliveredIDs(t, e.consumer, []string{insertLarge(limit - mib)}, 2*time.Minute, nil)
	_, publishedPeak := memoryBudgetRSS(t, pid)

	if exited, err := p.Exited(); exited {
		t.Fatalf("relay exited: %v", err)
	}
	t.Logf("RSS before %d MiB; peak after a %d MiB row parked %d MiB; peak after a %d MiB row published %d MiB",
		baseline>>10, big/mib, parkedPeak>>10, (limit-mib)/mib, publishedPeak>>10)
	// Received once (its size) plus the runtime's slack; a copy would add
	// its size again.
	if grown := parkedPeak - baseline; grown > (big+big/2)>>10 {
		t.Fatalf("a %d MiB oversize row grew the peak by %d MiB: it was copied before being judged", big/mib, grown>>10)
	}
}
