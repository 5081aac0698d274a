package faults_test

import (
	"context"
	"encoding/json"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// reportEnv names a file the tests append their figures to (JSON lines).
const reportEnv = "CDCRELAY_FAULTS_REPORT"

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
	var ids []string
	for id := range w.outbox(t) {
		ids = append(ids, id)
	}
	relaytest.WaitDelivered(t, w.consumer, ids, within, nil)
}

// waitIDs waits until every id has reached the consumer at least once.
func (w *world) waitIDs(t *testing.T, ids []string, within time.Duration) {
	t.Helper()
	relaytest.WaitDelivered(t, w.consumer, ids, within, nil)
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
	first := make(map[string]time.Time, len(want))
	lastByKey := map[string]relaytest.Position{}
	var lastGlobal relaytest.Position
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
		p, err := relaytest.PositionOf(d)
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
		if p.Index != r.n-1 {
			t.Fatalf("delivery %d (%s): index header %d for row %d of its transaction", i, d.MessageID, p.Index, r.n)
		}
		if prev, ok := lastByKey[d.RoutingKey]; ok && !p.After(prev) {
			reordered++
			t.Errorf("delivery %d (%s, key %s) out of commit order: %s/%d after %s/%d", i, d.MessageID, d.RoutingKey, p.LSN, p.Index, prev.LSN, prev.Index)
		} else {
			lastByKey[d.RoutingKey] = p
		}
		if !p.After(lastGlobal) {
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
