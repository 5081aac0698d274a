package monitor

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// On a table with no index on its unpublished rows (the HOT layout,
// migrations/optional/hot_marks.sql) the backlog query reads the rows with
// enqueued_at >= floor along an index on enqueued_at, instead of the whole
// table. The floor's invariant: every row whose enqueued_at is below it,
// committed now or later, is published or parked. Rows take enqueued_at
// from DEFAULT now(), their transaction's start, so a row can still commit
// below a time t only from a transaction that was open at t. A reading
// records t and the transactions open in the database then (virtual ids
// in pg_locks, and prepared transactions, which every role may read);
// once none of them is open any
// more, every row below t is committed, and the scan that follows sees it.
// The floor then moves to t, or to the oldest unpublished row that scan
// found if that is older: a row stuck unpublished holds the floor, and
// every later scan reads from it, so the gauges keep seeing it.

// openAt is a reading: a refresh's time and the transactions open in the
// database then.
type openAt struct {
	at    time.Time
	vxids []string // sorted (Go's order)
}

// maxPending bounds the readings kept while a long transaction holds them
// all open. When full, the newest replaces the last: the floor can then
// not stop at the readings dropped, only at earlier or later ones, which
// is as safe.
const maxPending = 1000

// floor is the bounded scan's state. Only the monitor's Run goroutine uses
// it.
type floor struct {
	at      *time.Time // nil: unknown, scan the whole table
	pending []openAt   // oldest first; each holds a transaction still open when last looked
	settled *time.Time // the newest pending reading found settled by this refresh
}

// observe records now's reading, and finds the newest earlier (or this)
// reading none of whose transactions is open now (open is now's set): the
// floor may move to its time after this refresh's scan. Open sets only
// shrink into later ones (a transaction open at an earlier reading and
// still open is open at every later one), so every older reading is
// settled too and is dropped.
func (f *floor) observe(now openAt) {
	if len(f.pending) < maxPending {
		f.pending = append(f.pending, now)
	} else {
		f.pending[len(f.pending)-1] = now
	}
	f.settled = nil
	for i := len(f.pending) - 1; i >= 0; i-- {
		if !overlaps(f.pending[i].vxids, now.vxids) {
			at := f.pending[i].at
			f.settled = &at
			f.pending = slices.Delete(f.pending, 0, i+1)
			return
		}
	}
}

// overlaps reports whether sorted a and b share an element.
func overlaps(a, b []string) bool {
	for i, j := 0, 0; i < len(a) && j < len(b); {
		switch {
		case a[i] == b[j]:
			return true
		case a[i] < b[j]:
			i++
		default:
			j++
		}
	}
	return false
}

// scanned moves the floor after a scan that covered every row at or above
// it (all rows while it is nil): to the settled reading's time, or to
// oldest, the oldest unpublished row the scan found that is not parked
// (nil: none), whichever is older. With no settled reading it stays.
func (f *floor) scanned(oldest *time.Time) {
	if f.settled == nil {
		return
	}
	next := *f.settled
	if oldest != nil && oldest.Before(next) {
		next = *oldest
	}
	f.at = &next
	f.settled = nil
}

// reset forgets the floor (the next scans read the whole table) after a
// failure or a change of the table's indexes.
func (f *floor) reset() { *f = floor{} }

// readingSQL reads now (less a second: a transaction's start time is taken
// a moment before its virtual id is visible in pg_locks), the virtual
// transaction ids held open in this database by other sessions, and its
// prepared transactions (PREPARE TRANSACTION gives up the virtual id; the
// transaction, and its rows, commit later).
const readingSQL = `
	SELECT now() - interval '1 second', coalesce(array_agg(id), '{}')
	FROM (SELECT l.virtualxid::text AS id
	      FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
	      WHERE l.locktype = 'virtualxid' AND l.mode = 'ExclusiveLock' AND l.granted
	        AND a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
	        AND l.pid <> pg_backend_pid()
	      UNION ALL
	      SELECT 'prepared ' || p.transaction::text FROM pg_prepared_xacts p WHERE p.database = current_database()) o`

// observeNow reads and records now's reading. It runs as a statement of its
// own before the scan, so that the scan's snapshot, taken after, sees every
// transaction this reading found ended.
func (m *Monitor) observeNow(ctx context.Context) error {
	var r openAt
	if err := m.db.QueryRow(ctx, readingSQL).Scan(&r.at, &r.vxids); err != nil {
		return fmt.Errorf("read the open transactions: %w", err)
	}
	slices.Sort(r.vxids) // in Go's order, which overlaps relies on
	m.floor.observe(r)
	return nil
}
