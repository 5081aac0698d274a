package janitor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/failpoint"
	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/pgerr"
)

// This file is the janitor's database side: its connection, the batched
// UPDATEs that mark and park rows, and the final flush.

// write connects if need be, then marks, then records parked events:
// parking can never hold marking back.
func (j *Janitor) write(ctx context.Context) error {
	if err := j.connect(ctx); err != nil {
		return err
	}
	err := j.flushMarks(ctx)
	if err == nil {
		err = j.flushParked(ctx)
	}
	if err != nil && j.db.IsClosed() {
		j.db = nil
	}
	return err
}

// connect opens the connection if there is none. Its commits are durable
// when they return (pgconnect.Options.Durable), also where the server,
// database or role sets synchronous_commit=off: a mark or a park that
// returned lets the slot pass its row (invariant 10,
// docs/architecture.md), and a crash must not undo it afterwards.
func (j *Janitor) connect(ctx context.Context) error {
	if j.db != nil && !j.db.IsClosed() {
		return nil
	}
	j.db = nil
	j.metrics.connects.Inc()
	db, err := pgconnect.Connect(ctx, j.opts.DatabaseURL, "to database for marks", pgconnect.Options{Durable: true, Setup: j.tag})
	if err != nil {
		return err
	}
	j.db = db
	return nil
}

// tag gives the connection's transactions the replication origin
// opts.Origin, so that the relay's stream skips them undecoded
// (pgconnect.SetupOrigin); it says once whether it could.
func (j *Janitor) tag(ctx context.Context, db *pgx.Conn) error {
	if j.opts.Origin == "" {
		return nil
	}
	// One probe per connection: the janitor's outlives the relay's
	// sessions, and says which of the two reasons when there is no origin.
	caps, err := pgcaps.Probe(ctx, db)
	if err != nil {
		return err
	}
	on, err := pgconnect.SetupProbedOrigin(ctx, db, caps, j.opts.Origin)
	if err != nil {
		return err
	}
	if !j.originNoted {
		j.originNoted = true
		msg, attrs := originNotice(on, caps, j.opts.Origin)
		j.log.Info(msg, attrs...)
	}
	return nil
}

// originNotice is the start-up line saying whether the marks carry a
// replication origin; caps is the server's. Without pgoutput's origin
// filter (pgcaps.Caps.OriginNone, PostgreSQL 16) there is nothing to
// change, so no remedy: a line pointing at one there sends operators after
// a grant that cannot help. Only a missing grant has a remedy.
func originNotice(on bool, caps pgcaps.Caps, origin string) (string, []any) {
	switch {
	case on:
		return "marks carry a replication origin: the walsender skips them undecoded", []any{"origin", origin}
	case !caps.OriginNone():
		return "marks carry no replication origin: PostgreSQL before 16 cannot skip them by origin, so the walsender decodes them and throws them away (expected; nothing to change)", nil
	default:
		return "marks carry no replication origin: the role may not use origins, so the walsender decodes them and throws them away", []any{"remedy", "docs/least-privilege.md"}
	}
}

func (j *Janitor) closeDB() {
	j.closeReplica()
	if j.db != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = j.db.Close(ctx)
		j.db = nil
	}
}

// queued returns how many marks are pending now.
func (j *Janitor) queued() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.pending)
}

// take moves up to one batch, and at most limit entries, from pending to
// held.
func (j *Janitor) take(limit int) []entry {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := min(len(j.pending), j.opts.MarkBatch, limit)
	batch := append([]entry(nil), j.pending[:n]...)
	j.pending = j.pending[n:]
	j.held += n
	return batch
}

// requeue ends a taken batch: back in front are those to write again now
// (the statement failed), at the end those to try at a later flush.
func (j *Janitor) requeue(n int, front, back []entry) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.held -= n
	if len(front) > 0 {
		j.pending = append(front, j.pending...)
	}
	j.pending = append(j.pending, back...)
	j.freed()
}

// flushMarks marks the ids queued when it starts, one UPDATE per batch,
// and calls each entry's done once its row is marked (or counts as gone).
// Ids queued meanwhile wait for the next flush (the next tick, or a full
// batch): looping until the queue is empty would, at a steady rate, chase
// each statement with another of the few ids acknowledged while it ran,
// and every statement and its round trips cost the primary about as much
// as tens of rows (measured at 1,000 events/s: 2.5 statements per tick of
// 40 ids each instead of one of 100).
func (j *Janitor) flushMarks(ctx context.Context) error {
	var later []entry // still held: a later flush tries them again
	defer func() { j.requeue(len(later), nil, later) }()
	for left := j.queued(); left > 0; {
		batch := j.take(left)
		if len(batch) == 0 {
			return nil
		}
		left -= len(batch)
		unseen, err := j.markBatch(ctx, batch)
		if err != nil {
			j.requeue(len(batch), batch, nil)
			return err
		}
		running, err := j.stillRunning(ctx, batch, unseen)
		ready, again := j.splitMarked(batch, unseen, running, err == nil)
		later = append(later, again...)
		lsn, standbys, werr := j.markPosition(ctx)
		if werr == nil {
			werr = j.awaitStandbys(ctx, lsn, standbys)
		}
		if werr == nil {
			werr = j.awaitReplica(ctx, lsn, readyIDs(ready))
		}
		if werr != nil {
			// Marked, but perhaps not on the standbys: written again (a
			// no-op) and released by a later flush.
			j.requeue(len(batch)-len(again), ready, nil)
			return werr
		}
		failpoint.Hit(failpoint.AfterMark)
		for _, e := range ready {
			e.done()
		}
		j.failing(nil) // a batch written: whatever fails next starts a new streak
		j.requeue(len(batch)-len(again), nil, nil)
		if err != nil {
			return err
		}
	}
	return nil
}

// stillRunningSQL returns those of the given 32-bit transaction ids that
// new snapshots do not see yet: still in the procarray, like a commit that
// waits for a synchronous standby although logical decoding already sent
// it. Each id is widened to the xid8 of the epoch just below the current
// snapshot's xmax (a decoded transaction is recent). PostgreSQL 13+.
const stillRunningSQL = `WITH c AS (SELECT s, pg_snapshot_xmax(s)::text::bigint AS xmax FROM pg_current_snapshot() AS s)
SELECT coalesce(array_agg(x), '{}') FROM unnest($1::bigint[]) AS x, c
WHERE NOT pg_visible_in_snapshot((c.xmax - ((c.xmax % 4294967296) - x + 4294967296) % 4294967296)::text::xid8, c.s)`

// stillRunning asks which transactions of the batch's unseen rows are not
// visible to new snapshots yet. Asked after the mark statement, so a
// transaction visible now was perhaps not visible to that statement: its
// row gets one more flush before it can count as gone (splitMarked).
func (j *Janitor) stillRunning(ctx context.Context, batch []entry, unseen map[string]bool) (map[uint32]bool, error) {
	var xids []int64
	for _, e := range batch {
		if unseen[e.id] && e.xid != 0 && !e.visible {
			xids = append(xids, int64(e.xid))
		}
	}
	if len(xids) == 0 {
		return nil, nil
	}
	var running []int64
	if err := j.db.QueryRow(ctx, stillRunningSQL, xids).Scan(&running); err != nil {
		j.forgetStale(err)
		return nil, fmt.Errorf("ask whether %d unseen rows' transactions are visible: %w", len(xids), err)
	}
	out := make(map[uint32]bool, len(running))
	for _, x := range running {
		out[uint32(x)] = true
	}
	return out, nil
}

// markBatch runs the mark statement and returns the ids whose rows it
// could not find.
func (j *Janitor) markBatch(ctx context.Context, batch []entry) (map[string]bool, error) {
	if err := j.statements(ctx); err != nil {
		return nil, err
	}
	ids := make([]string, len(batch))
	for i, e := range batch {
		ids[i] = e.id
	}
	var marked int64
	var missing []string
	if err := j.db.QueryRow(ctx, j.markSQL, ids).Scan(&marked, &missing); err != nil {
		j.forgetStale(err)
		return nil, fmt.Errorf("mark %d events published: %w", len(batch), err)
	}
	j.metrics.marked.Add(float64(marked))
	unseen := make(map[string]bool, len(missing))
	for _, id := range missing {
		unseen[id] = true
	}
	return unseen, nil
}

func readyIDs(es []entry) []string {
	ids := make([]string, len(es))
	for i, e := range es {
		ids[i] = e.id
	}
	return ids
}

// splitMarked returns as ready the entries whose rows are marked (the
// UPDATE has committed: it ran outside any transaction) and those gone:
// not found by a flush that ran after their transaction was seen visible
// to new snapshots; the caller (flushMarks, or parkUnseen for a parked
// row) calls their done. A row whose transaction is still running
// (running, asked after this flush: known false when asking failed) is
// waited for however long that takes; one whose transaction is visible
// now gets one more flush, whose snapshot is newer. Those are returned as
// again, to try later.
func (j *Janitor) splitMarked(batch []entry, unseen map[string]bool, running map[uint32]bool, known bool) (ready, again []entry) {
	gone := 0
	for _, e := range batch {
		switch {
		case !unseen[e.id]:
			ready = append(ready, e)
		case e.visible:
			gone++
			ready = append(ready, e)
		default:
			e.visible = known && (e.xid == 0 || !running[e.xid])
			again = append(again, e)
		}
	}
	if gone > 0 {
		j.metrics.gone.Add(float64(gone))
		j.log.Info("events' rows not found although their transactions are visible; counted as deleted", "events", gone)
	}
	return ready, again
}

// flushParked records parked events, one statement per row (poison is
// rare). A role without the grant, or a table without the columns, gets
// one report; the rows are skipped all the same. A row not visible yet
// stays queued for the next flush.
func (j *Janitor) flushParked(ctx context.Context) error {
	j.mu.Lock()
	todo := j.parked
	j.parked = nil
	j.mu.Unlock()
	var again []parked
	for i, p := range todo {
		later, err := j.recordParked(ctx, p)
		if err != nil {
			j.mu.Lock()
			j.parked = append(append(again, todo[i:]...), j.parked...)
			j.mu.Unlock()
			return err
		}
		if later != nil {
			again = append(again, *later)
		}
	}
	j.mu.Lock()
	j.parked = append(again, j.parked...)
	j.freed()
	j.mu.Unlock()
	return nil
}

// recordParked records one park and calls its done, or returns it to try
// again (parkUnseen).
func (j *Janitor) recordParked(ctx context.Context, p parked) (*parked, error) {
	if err := j.statements(ctx); err != nil {
		return nil, err
	}
	tag, err := j.db.Exec(ctx, j.parkSQL, p.id, p.reason)
	var pgErr *pgconn.PgError
	switch {
	case err == nil && tag.RowsAffected() == 0:
		return j.parkUnseen(ctx, p)
	case err == nil:
		j.metrics.parked.Inc()
	case errors.As(err, &pgErr) && (pgErr.Code == pgerr.InsufficientPrivilege || pgErr.Code == pgerr.UndefinedColumn):
		j.metrics.parkUnrecorded.Inc()
		if !j.parkNoted {
			j.parkNoted = true
			j.log.Warn("cannot record parked poison events on their rows (grant UPDATE (attempts, last_error), or add the columns); they are skipped unrecorded, marking goes on; reported once",
				"event", p.id, "error", err)
		}
	default:
		j.forgetStale(err)
		return nil, fmt.Errorf("record parked event %s: %w", p.id, err)
	}
	p.done()
	return nil, nil
}

// parkUnseen handles a park whose UPDATE found no row with splitMarked,
// as a mark's: a poison event is parked with no broker round trip, so its
// UPDATE can run before the row's transaction is visible (a commit waiting
// for a synchronous standby, or just not yet out of the procarray) and
// must not settle then, or the slot would pass a row neither published nor
// parked. It is tried again while that transaction runs, once more when it
// is visible, and counted gone (deleted, or marked published by someone
// else) when even that finds nothing.
func (j *Janitor) parkUnseen(ctx context.Context, p parked) (*parked, error) {
	batch, unseen := []entry{p.entry}, map[string]bool{p.id: true}
	running, err := j.stillRunning(ctx, batch, unseen)
	if err != nil {
		return nil, err
	}
	if _, again := j.splitMarked(batch, unseen, running, true); len(again) == 1 {
		p.entry = again[0]
		return &p, nil
	}
	p.done()
	return nil, nil
}

// forgetStale drops the statements built with the id column's type when
// an error says that type changed (ALTER COLUMN ... TYPE), so the next
// flush builds them again.
func (j *Janitor) forgetStale(err error) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return
	}
	switch pgErr.Code {
	case pgerr.UndefinedFunction, // operator does not exist: the column is not of the cast type any more
		pgerr.DatatypeMismatch,    // datatype mismatch
		pgerr.FeatureNotSupported: // cached plan must not change result type
		j.markSQL, j.parkSQL, j.replicaSQL = "", "", ""
		j.log.Info("the outbox id column's type changed; rebuilding the janitor's statements", "error", err)
	}
}

// statements builds the UPDATEs with the parameter cast to the id column's
// own type, so the primary key index finds the rows.
func (j *Janitor) statements(ctx context.Context) error {
	if j.markSQL != "" {
		return nil
	}
	table := pgx.Identifier{j.opts.Schema, j.opts.Table}.Sanitize()
	var typ string
	var unique bool // a unique index on the id column alone (a primary key on it, say)
	err := j.db.QueryRow(ctx, `SELECT format_type(a.atttypid, a.atttypmod),
		       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisunique AND i.indisvalid
		                 AND i.indpred IS NULL AND i.indnkeyatts = 1 AND i.indkey[0] = a.attnum)
		FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attname = $2 AND NOT a.attisdropped`, table, j.opts.IDColumn).Scan(&typ, &unique)
	if err != nil {
		return fmt.Errorf("look up the type of %s.%s: %w", table, j.opts.IDColumn, err)
	}
	id := pgx.Identifier{j.opts.IDColumn}.Sanitize()
	// One round trip marks the batch and names the ids whose rows this
	// snapshot cannot see (not visible yet, or gone); rows already marked
	// count as seen. When the UPDATE marked rows of as many distinct ids as
	// the batch holds, none is missing, and the second lookup of every id
	// is skipped (an uncorrelated subquery in a CASE branch runs only if
	// the branch is taken): 19% fewer buffer accesses for a batch of 100.
	// Distinct ids, not rows: two rows of one id must not stand in for
	// another id's row that this snapshot cannot see yet
	// (TestIntegrationMarkStatementIDNotUnique). Only a unique index makes
	// rows and ids the same count; without one (a partitioned outbox's
	// primary key must include the partition key) the ids are counted
	// distinct, a sort that costs about 15% more per marked row.
	returning, distinct := "1", "count(*)"
	if !unique {
		returning, distinct = id, "count(DISTINCT id)"
	}
	// The unpublished test is written `(published_at IS NULL) IS NOT
	// FALSE`, the same truth, so that it does not imply the predicate of
	// the partial index on unpublished rows: with `published_at IS NULL`
	// the planner may walk that index and filter the ids, and it does when
	// the statistics predate a backlog (they say the index is small), so
	// each batch of a backlog of n rows would read all n of them. Without
	// that index to choose, it matches the ids through the primary key, or
	// on a small table in one pass over it (TestIntegrationMarkStatementPlan).
	j.replicaSQL = replicaQuestion(table, id, typ)
	j.markSQL = fmt.Sprintf(`WITH marked AS (
			UPDATE %[1]s SET published_at = now() WHERE %[2]s = ANY($1::%[3]s[]) AND (published_at IS NULL) IS NOT FALSE RETURNING %[4]s AS id),
		n AS (SELECT count(*) AS c, %[5]s AS d FROM marked)
		SELECT n.c, CASE WHEN n.d = cardinality($1::%[3]s[]) THEN '{}'::text[]
		       ELSE coalesce((SELECT array_agg(x::text) FROM unnest($1::%[3]s[]) x
		                      WHERE NOT EXISTS (SELECT 1 FROM %[1]s WHERE %[2]s = x)), '{}') END
		FROM n`, table, id, typ, returning, distinct)
	j.parkSQL = fmt.Sprintf(`UPDATE %s SET attempts = attempts + 1, last_error = left($2, 2000) WHERE %s = $1::%s AND published_at IS NULL`, table, id, typ)
	return nil
}

// flushOnExit writes what is still queued within a few seconds, then
// closes the connection. What it cannot write is harmless: those events'
// callbacks were never called, so the slot did not pass them, and the next
// start publishes and marks them again.
func (j *Janitor) flushOnExit() {
	defer j.closeDB()
	if j.Pending() == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), exitFlush)
	defer cancel()
	if err := j.write(ctx); err != nil {
		j.log.Warn("could not write the last marks; their events will be published and marked again on the next start", "error", err)
	}
}

// explainDenied adds to a permission error (42501) the privilege the
// janitor needs, with the statement that grants it, so the repeating
// warning says more than "permission denied for table".
func (j *Janitor) explainDenied(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerr.InsufficientPrivilege {
		return err
	}
	table, role := pgx.Identifier{j.opts.Schema, j.opts.Table}.Sanitize(), "<role>"
	if c, perr := pgx.ParseConfig(j.opts.DatabaseURL); perr == nil && c.User != "" {
		role = pgx.Identifier{c.User}.Sanitize()
	}
	return fmt.Errorf("%w: the relay's role needs UPDATE (published_at, attempts, last_error) on %s to mark rows published: GRANT UPDATE (published_at, attempts, last_error) ON %s TO %s; (docs/least-privilege.md)", err, table, table, role)
}
