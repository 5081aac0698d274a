//go:build pgmatrix

package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/inbox"
	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// TestIntegrationFailoverTimelinePairs is the review's h48 on PostgreSQL 17:
// an asynchronous standby whose link is frozen while the relay keeps
// publishing, the primary killed, the standby promoted, no failover slot
// (the relay adopts the promoted node: a new slot, a snapshot backfill).
// The promoted node reuses the LSNs of the old primary's last transactions
// (phantoms it never received), so (commit LSN, index) pairs go back and
// repeat. With cdcrelay-timeline, every message carries its session's
// timeline, every event first delivered after the promotion sorts after
// every event delivered before the kill by (timeline, commit LSN, index),
// no triple names two events, and the inbox's ordering (inbox.Position.Less,
// applied as the inbox applies it) calls none of them late. The pair-only
// figures are logged: they are what a consumer without the header sees.
func TestIntegrationFailoverTimelinePairs(t *testing.T) {
	testenv.RequireMajor(t, 17)
	ctx := context.Background()
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	link, sb, primary := linkedStandby(t, e, nil)
	oldTimeline := serverTimeline(t, primary)
	startFailoverRelay(t, e, sb, map[string]string{"SLOT": "cdcrelay_timeline", "SLOT_FAILOVER": "off", "LOG_LEVEL": "debug"})

	prod := startProducer(t, multiHostURL(t, e.dbURL, e.pg.Port(), sb.Port()))
	waitUntil(t, 60*time.Second, "500 events delivered under load", func() bool { return e.consumer.Count() >= 500 })
	// The standby stops receiving; the relay goes on publishing what only
	// the primary will ever have had.
	link.HoldDownstream(true)
	time.Sleep(3 * time.Second)
	if err := e.pg.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	// Nothing can commit or be published until the promotion: once the
	// deliveries in flight have arrived, they are all the old timeline's.
	awaitQuiet(t, e.consumer)
	beforeKill := e.consumer.Count()
	committedBefore := prod.count()
	sdb := relaytest.Connect(t, sb.URL("app"))
	if err := sb.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sdb.Exec(ctx, `CHECKPOINT`); err != nil { // pg_control then names the new timeline
		t.Fatal(err)
	}
	newTimeline := serverTimeline(t, sdb)
	if newTimeline <= oldTimeline {
		t.Fatalf("the promoted node is on timeline %d, the primary was on %d", newTimeline, oldTimeline)
	}
	waitUntil(t, 90*time.Second, "the producer commits on the promoted node", func() bool { return prod.count() >= committedBefore+600 })
	committed := prod.halt()
	var rows []string
	if err := sdb.QueryRow(ctx, `SELECT coalesce(array_agg(id::text), '{}') FROM event_outbox`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	relaytest.WaitDelivered(t, e.consumer, rows, 90*time.Second, nil)

	all := e.consumer.Deliveries()
	before, after := all[:beforeKill], all[beforeKill:]
	have := make(map[string]bool, len(rows))
	for _, id := range rows {
		have[id] = true
	}
	var maxTriple, maxPair triple
	delivered := map[string]bool{}
	phantoms := 0
	for _, d := range before {
		tr := tripleOf(t, d)
		if tr.timeline != oldTimeline {
			t.Fatalf("%s delivered before the kill with timeline %d, the primary's is %d", d.MessageID, tr.timeline, oldTimeline)
		}
		maxTriple = greaterKey(maxTriple, tr, true)
		maxPair = greaterKey(maxPair, tr, false)
		if !delivered[d.MessageID] && !have[d.MessageID] {
			phantoms++
		}
		delivered[d.MessageID] = true
	}
	if phantoms == 0 {
		t.Fatal("no event of the old primary is missing on the promoted node: the frozen link made no phantom, the test shows nothing")
	}

	// Every event first delivered after the kill: the new primary's, and
	// the old one's the standby had but the relay had not published.
	var newEvents, pairNotAfter, tripleNotAfter, wrongTimeline int
	newOnPromoted := map[string]bool{}
	for _, id := range committed[committedBefore:] {
		newOnPromoted[id] = true
	}
	var committedNew, pairNotAfterCommittedNew int
	for _, d := range after {
		tr := tripleOf(t, d)
		if tr.timeline != newTimeline {
			wrongTimeline++
		}
		if delivered[d.MessageID] {
			continue // a duplicate: its message_id was delivered before
		}
		delivered[d.MessageID] = true
		newEvents++
		if !maxPair.pairLess(tr) {
			pairNotAfter++
			if newOnPromoted[d.MessageID] {
				pairNotAfterCommittedNew++
			}
		}
		if newOnPromoted[d.MessageID] {
			committedNew++
		}
		if !maxTriple.less(tr) {
			tripleNotAfter++
			if tripleNotAfter <= 5 {
				t.Errorf("%s first delivered after the promotion at %s, not after %s, the greatest delivered before the kill", d.MessageID, tr, maxTriple)
			}
		}
	}
	if tripleNotAfter != 0 {
		t.Errorf("%d of %d events first delivered after the promotion sort at or below the greatest (timeline, commit LSN, index) delivered before the kill", tripleNotAfter, newEvents)
	}
	if wrongTimeline != 0 {
		t.Errorf("%d deliveries after the promotion do not carry the promoted node's timeline %d", wrongTimeline, newTimeline)
	}
	if committedNew == 0 {
		t.Fatal("no event committed on the promoted node was delivered")
	}

	// Two events on one pair (a phantom and a new event) and the same on
	// the triple; a triple repeated by one event is a redelivery.
	pairs, triples := map[string]map[string]bool{}, map[string]map[string]bool{}
	for _, d := range all {
		tr := tripleOf(t, d)
		noteID(pairs, fmt.Sprintf("%s#%d", tr.lsn, tr.index), d.MessageID)
		noteID(triples, tr.String(), d.MessageID)
	}
	sharedPairs, sharedTriples := keysNamingTwo(pairs), keysNamingTwo(triples)
	if sharedTriples != 0 {
		t.Errorf("%d triples name two different events", sharedTriples)
	}

	// The inbox's order on the one routing key, as advanceOrder keeps it:
	// the greatest position of the events not late, duplicates (by
	// message_id) never classified.
	lateWith, lateWithout := inboxLate(t, all, true), inboxLate(t, all, false)
	if lateWith != 0 {
		t.Errorf("the inbox would call %d events late with the timeline header", lateWith)
	}
	t.Logf("timelines %d -> %d; %d deliveries before the kill (%d phantoms), greatest %s; %d events first delivered after the promotion, %d of them committed on the promoted node",
		oldTimeline, newTimeline, len(before), phantoms, maxTriple, newEvents, committedNew)
	t.Logf("by pair alone (no timeline): %d of %d new events at or below the greatest pair before the kill (%d of the %d committed on the promoted node), %d pairs shared by two events, %d events the inbox calls late",
		pairNotAfter, newEvents, pairNotAfterCommittedNew, committedNew, sharedPairs, lateWithout)
	t.Logf("by (timeline, commit LSN, index): %d new events at or below, %d triples shared by two events, %d events the inbox calls late",
		tripleNotAfter, sharedTriples, lateWith)
}

// triple is a delivery's (timeline, commit LSN, index).
type triple struct {
	timeline uint32
	lsn      pglogrepl.LSN
	index    int64
	set      bool
}

func (a triple) pairLess(b triple) bool {
	return a.lsn < b.lsn || (a.lsn == b.lsn && a.index < b.index)
}

func (a triple) less(b triple) bool {
	if a.timeline != b.timeline {
		return a.timeline < b.timeline
	}
	return a.pairLess(b)
}

func (a triple) String() string { return fmt.Sprintf("%d:%s#%d", a.timeline, a.lsn, a.index) }

// greaterKey is the greater of m and tr, by triple or by pair alone.
func greaterKey(m, tr triple, withTimeline bool) triple {
	if !m.set || (withTimeline && m.less(tr)) || (!withTimeline && m.pairLess(tr)) {
		return tr
	}
	return m
}

// tripleOf reads a delivery's ordering headers; the relay sends the
// timeline as a long-long.
func tripleOf(t *testing.T, d testenv.Delivery) triple {
	t.Helper()
	pos, err := relaytest.PositionOf(d)
	if err != nil {
		t.Fatalf("%s: %v", d.MessageID, err)
	}
	tl, ok := d.Headers[publish.HeaderTimeline].(int64)
	if !ok || tl <= 0 {
		t.Fatalf("%s: %s header %#v, want the session's timeline", d.MessageID, publish.HeaderTimeline, d.Headers[publish.HeaderTimeline])
	}
	return triple{timeline: uint32(tl), lsn: pos.LSN, index: pos.Index, set: true}
}

// inboxLate counts the events the inbox would classify OrderLate, in
// arrival order on one routing key, comparing with inbox.Position.Less;
// without the timeline it compares as for a relay older than the header.
func inboxLate(t *testing.T, all []testenv.Delivery, withTimeline bool) int {
	t.Helper()
	seenIDs := map[string]bool{}
	var seen inbox.Position
	late := 0
	for _, d := range all {
		if seenIDs[d.MessageID] {
			continue
		}
		seenIDs[d.MessageID] = true
		tr := tripleOf(t, d)
		pos := inbox.Position{CommitLSN: uint64(tr.lsn), TxIndex: tr.index, Valid: true}
		if withTimeline {
			pos.Timeline = tr.timeline
		}
		if seen.Valid && pos.Less(seen) {
			late++
			continue
		}
		seen = pos
	}
	return late
}

func noteID(m map[string]map[string]bool, key, id string) {
	if m[key] == nil {
		m[key] = map[string]bool{}
	}
	m[key][id] = true
}

// keysNamingTwo counts the keys that name more than one event.
func keysNamingTwo(m map[string]map[string]bool) int {
	n := 0
	for _, ids := range m {
		if len(ids) > 1 {
			n++
		}
	}
	return n
}

// serverTimeline is the timeline of the server's last checkpoint.
func serverTimeline(t *testing.T, db *pgx.Conn) uint32 {
	t.Helper()
	var tl int64
	if err := db.QueryRow(context.Background(), `SELECT timeline_id FROM pg_control_checkpoint()`).Scan(&tl); err != nil {
		t.Fatal(err)
	}
	return uint32(tl)
}

// awaitQuiet waits until no delivery has arrived for a second.
func awaitQuiet(t *testing.T, c *testenv.Consumer) {
	t.Helper()
	last, since := c.Count(), time.Now()
	waitUntil(t, 30*time.Second, "the deliveries in flight to arrive", func() bool {
		if n := c.Count(); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) >= time.Second
	})
}
