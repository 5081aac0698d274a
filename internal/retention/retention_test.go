package retention

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationRetentionDeletesOnlyExpiredPublished: a pass deletes every row
// published longer ago than the retention and nothing else (unpublished,
// parked, recently published, or enqueued long ago but published
// recently), with the index, without it, and on a table without
// enqueued_at; each degradation is logged once.
func TestIntegrationRetentionDeletesOnlyExpiredPublished(t *testing.T) {
	url, db := newDB(t)
	for _, c := range []struct {
		name, setup, warning string
	}{
		{"index", "", ""},
		{"no index", "DROP INDEX event_outbox_published_idx", "has no index on (enqueued_at)"},
		{"no enqueued_at", "ALTER TABLE event_outbox DROP COLUMN enqueued_at", "has no enqueued_at column"},
	} {
		t.Run(c.name, func(t *testing.T) {
			mustExec(t, db, `TRUNCATE event_outbox`)
			before := fill(t, db, 5000)
			if c.setup != "" {
				mustExec(t, db, c.setup)
			}
			logs := &testenv.Buffer{}
			r, _ := newTestRetention(url, 300, logs)
			for pass := range 2 {
				n, err := r.runOnce(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				want := int64(before["expired"])
				if pass == 1 {
					want = 0
				}
				if n != want {
					t.Fatalf("pass %d deleted %d rows, want %d", pass+1, n, want)
				}
			}
			checkKept(t, db, before)
			if got := deleted(r); got != float64(before["expired"]) {
				t.Fatalf("deleted counter %v, want %d", got, before["expired"])
			}
			warnings := strings.Count(logs.String(), "level=WARN")
			switch {
			case c.warning == "" && warnings != 0:
				t.Fatalf("warnings with the index: %s", logs)
			case c.warning != "" && (warnings != 1 || !strings.Contains(logs.String(), c.warning)):
				t.Fatalf("want one warning %q over two passes, got: %s", c.warning, logs)
			}
		})
	}
}

// TestIntegrationRetentionBatchesFlat: the buffers each batch reads stay flat from
// the first batch to the last (the old statement re-scanned the heap from
// its start: 81 buffers for the first batch, 1,763 for the 37th on 200k
// rows), along the index, and along block ranges without it. 50,000 rows;
// the 1,000,000-row figures come from TestIntegrationRetentionMillion (tag
// retentionbench, docs/performance.md).
func TestIntegrationRetentionBatchesFlat(t *testing.T) {
	url, db := newDB(t)
	for _, c := range []struct {
		name   string
		blocks bool
	}{{"index", false}, {"blocks", true}} {
		t.Run(c.name, func(t *testing.T) {
			mustExec(t, db, `TRUNCATE event_outbox`)
			before := fill(t, db, 50000)
			r, _ := newTestRetention(url, 1000, &testenv.Buffer{})
			bufs, used := batchBuffers(t, db, r, c.blocks)
			checkKept(t, db, before)
			if !c.blocks && (!used["event_outbox_published_idx"] || used["node:Seq Scan"]) {
				t.Fatalf("the batches did not walk event_outbox_published_idx alone (plans: %v)", used)
			}
			if c.blocks && (!used["node:Tid Range Scan"] || used["node:Seq Scan"]) {
				t.Fatalf("the batches did not use TID range scans (plans: %v)", used)
			}
			median, highest := flat(t, c.name, bufs)
			t.Logf("%s: %d rows deleted, buffers per batch: %s, median %d, highest %d", c.name, before["expired"], summary(bufs), median, highest)
		})
	}
}

// TestIntegrationRetentionRunsOnlyWhileActive: nothing runs while the relay is not
// active, the first pass comes FirstDelay after it becomes active, and a
// pass stops between batches once it is no longer active.
func TestIntegrationRetentionRunsOnlyWhileActive(t *testing.T) {
	url, db := newDB(t)
	before := fill(t, db, 20000)
	var active atomic.Bool
	r, _ := newTestRetention(url, 100, &testenv.Buffer{})
	r.opts.Interval, r.opts.FirstDelay = 200*time.Millisecond, 500*time.Millisecond
	r.opts.Active = func() bool {
		on := active.Load()
		if on && deleted(r) >= 1000 { // the relay stops streaming mid-pass
			active.Store(false)
		}
		return on
	}
	bg := testenv.Go(r.Run)
	defer func() { _ = bg.Stop() }()
	time.Sleep(time.Second)
	if n, runs := deleted(r), counterValue(r.m.runs)+counterValue(r.m.errors); n != 0 || runs != 0 {
		t.Fatalf("%v passes (%v rows deleted) while not active", runs, n)
	}
	active.Store(true)
	became := time.Now()
	bg.WaitFor(t, 30*time.Second, "a first pass", func() bool { return deleted(r) > 0 })
	if since := time.Since(became); since < 500*time.Millisecond {
		t.Fatalf("first pass %s after becoming active, before FirstDelay", since)
	}
	bg.WaitFor(t, 30*time.Second, "the relay to stop being active", func() bool { return !active.Load() })
	time.Sleep(time.Second)
	if n := deleted(r); n < 1000 || n > 1100 {
		t.Fatalf("deleted %v rows; the pass should have stopped within a batch of 1000", n)
	}
	if left := kinds(t, db)["expired"]; left == 0 || left != before["expired"]-int(deleted(r)) {
		t.Fatalf("%d expired rows left after %v deleted of %d", left, deleted(r), before["expired"])
	}
}
