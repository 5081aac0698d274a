// Package janitor keeps the outbox table tidy behind the relay: it marks
// acknowledged events published_at in batches and deletes old published
// rows.
package janitor

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configure a Janitor.
type Options struct {
	DatabaseURL   string
	Schema, Table string
	IDColumn      string
	MarkInterval  time.Duration // how often acked ids are flushed
	MarkBatch     int           // ids per UPDATE
}

// maxPending bounds the acked ids held while the database cannot be
// written. Dropping one only leaves its row unmarked: it is not lost, it
// may be published again by a later snapshot backfill.
const maxPending = 1 << 20

// Janitor is a stage: Mark hands it acked ids, Run writes them.
type Janitor struct {
	opts    Options
	log     *slog.Logger
	metrics *metrics

	mu      sync.Mutex
	pending []string
	parked  []parked
	wake    chan struct{} // a full batch is waiting

	markSQL string // built once the id column's type is known
	parkSQL string
	// unseen counts, per id, the flushes that did not find its row. The
	// relay can receive a transaction from the slot an instant before its
	// rows are visible to other sessions, so such an id is tried again at
	// the next flush, up to maxUnseen() times. Only the Run goroutine uses it.
	unseen map[string]int
}

// unseenFor is about how long an acked id whose row no flush can see is
// tried again before the mark is given up; a commit can stay invisible
// that long while a synchronous standby lags.
const unseenFor = 10 * time.Second

// maxUnseen is how many flushes may miss an acked id's row before the mark
// is given up: unseenFor at the mark interval, and never fewer than 20.
func (j *Janitor) maxUnseen() int {
	n := 20
	if j.opts.MarkInterval > 0 {
		n = max(n, int(unseenFor/j.opts.MarkInterval))
	}
	return n
}

// New returns a Janitor; its metrics are registered with reg.
func New(opts Options, log *slog.Logger, reg prometheus.Registerer) *Janitor {
	return &Janitor{opts: opts, log: log, metrics: newMetrics(reg), wake: make(chan struct{}, 1)}
}

// Mark records that the broker acknowledged the event with this id. It
// never blocks: it is called from the confirm loop.
func (j *Janitor) Mark(id string) {
	j.mu.Lock()
	if len(j.pending) >= maxPending {
		j.pending = j.pending[1:]
		j.metrics.dropped.Inc()
	}
	j.pending = append(j.pending, id)
	full := len(j.pending) >= j.opts.MarkBatch
	j.mu.Unlock()
	if full {
		select {
		case j.wake <- struct{}{}:
		default:
		}
	}
}

// parked is a poison event to record on its row.
type parked struct{ id, reason string }

// Park records that the event with this id was parked as poison: its row
// gets attempts+1 and last_error, and stays unpublished. It never blocks.
func (j *Janitor) Park(id, reason string) {
	j.mu.Lock()
	j.parked = append(j.parked, parked{id, reason})
	j.mu.Unlock()
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// Run marks, deletes and measures until ctx ends, then flushes the ids it
// still holds (for at most a few seconds). Statement failures are logged,
// counted and retried; they never stop the relay.
func (j *Janitor) Run(ctx context.Context) error {
	var db *pgx.Conn
	defer func() { j.flushOnExit(db) }()
	mark := time.NewTicker(j.opts.MarkInterval)
	defer mark.Stop()
	for {
		var task func(context.Context, *pgx.Conn) error
		select {
		case <-ctx.Done():
			return nil
		case <-mark.C:
			task = j.flush
		case <-j.wake:
			task = j.flush
		}
		var err error
		if db, err = j.conn(ctx, db); err == nil {
			err = task(ctx, db)
		}
		if err != nil && ctx.Err() == nil {
			j.metrics.errors.Inc()
			j.log.Warn("janitor statement failed; will retry", "error", err)
			if db != nil && db.IsClosed() {
				db = nil
			}
		}
	}
}

// conn returns db, or a new connection when there is none.
func (j *Janitor) conn(ctx context.Context, db *pgx.Conn) (*pgx.Conn, error) {
	if db != nil && !db.IsClosed() {
		return db, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	db, err := pgx.Connect(cctx, j.opts.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return db, nil
}

func (j *Janitor) take() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := min(len(j.pending), j.opts.MarkBatch)
	batch := append([]string(nil), j.pending[:n]...)
	j.pending = j.pending[n:]
	return batch
}

func (j *Janitor) putBack(batch []string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.pending = append(batch, j.pending...)
}

// flush records parked events, then marks every pending id, one UPDATE
// per batch.
func (j *Janitor) flush(ctx context.Context, db *pgx.Conn) error {
	if err := j.flushParked(ctx, db); err != nil {
		return err
	}
	var later []string
	defer func() { j.retryUnseen(later) }()
	for {
		batch := j.take()
		if len(batch) == 0 {
			return nil
		}
		sql, err := j.markStatement(ctx, db)
		if err != nil {
			j.putBack(batch)
			return err
		}
		var marked int64
		var unseen []string
		if err := db.QueryRow(ctx, sql, batch).Scan(&marked, &unseen); err != nil {
			j.putBack(batch)
			return fmt.Errorf("mark %d events published: %w", len(batch), err)
		}
		j.metrics.marked.Add(float64(marked))
		later = append(later, unseen...)
	}
}

// retryUnseen queues ids whose rows the last flush could not see for the
// next one, and gives up on those missed too often (the row was deleted,
// or is not there at all): they stay unmarked, never wrongly marked.
func (j *Janitor) retryUnseen(ids []string) {
	if j.unseen == nil {
		j.unseen = map[string]int{}
	}
	seen := make(map[string]bool, len(ids))
	var again []string
	for _, id := range ids {
		seen[id] = true
		j.unseen[id]++
		if j.unseen[id] > j.maxUnseen() {
			delete(j.unseen, id)
			j.metrics.dropped.Inc()
			j.log.Warn("acked event's row not found; left unmarked", "event", id)
			continue
		}
		again = append(again, id)
	}
	for id := range j.unseen { // found this time (or not in this flush at all)
		if !seen[id] && !j.queued(id) {
			delete(j.unseen, id)
		}
	}
	if len(again) > 0 {
		j.mu.Lock()
		j.pending = append(j.pending, again...)
		j.mu.Unlock()
	}
}

// queued reports whether id still waits in pending.
func (j *Janitor) queued(id string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, p := range j.pending {
		if p == id {
			return true
		}
	}
	return false
}

// flushParked writes attempts and last_error for parked events. Poison is
// rare, so one statement per row is fine.
func (j *Janitor) flushParked(ctx context.Context, db *pgx.Conn) error {
	j.mu.Lock()
	todo := j.parked
	j.parked = nil
	j.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	if _, err := j.markStatement(ctx, db); err != nil {
		j.requeueParked(todo)
		return err
	}
	for i, p := range todo {
		if _, err := db.Exec(ctx, j.parkSQL, p.id, p.reason); err != nil {
			j.requeueParked(todo[i:])
			return fmt.Errorf("record parked event %s: %w", p.id, err)
		}
		j.metrics.parked.Inc()
	}
	return nil
}

func (j *Janitor) requeueParked(todo []parked) {
	j.mu.Lock()
	j.parked = append(todo, j.parked...)
	j.mu.Unlock()
}

// markStatement builds the UPDATE with the parameter cast to the id
// column's own type, so the primary key index finds the rows.
func (j *Janitor) markStatement(ctx context.Context, db *pgx.Conn) (string, error) {
	if j.markSQL != "" {
		return j.markSQL, nil
	}
	table := pgx.Identifier{j.opts.Schema, j.opts.Table}.Sanitize()
	var typ string
	err := db.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = $1::regclass AND attname = $2 AND NOT attisdropped`, table, j.opts.IDColumn).Scan(&typ)
	if err != nil {
		return "", fmt.Errorf("look up the type of %s.%s: %w", table, j.opts.IDColumn, err)
	}
	id := pgx.Identifier{j.opts.IDColumn}.Sanitize()
	// One round trip marks the batch and names the ids whose rows this
	// snapshot cannot see yet (see unseen); rows already marked count as seen.
	j.markSQL = fmt.Sprintf(`WITH marked AS (
			UPDATE %[1]s SET published_at = now() WHERE %[2]s = ANY($1::%[3]s[]) AND published_at IS NULL RETURNING 1)
		SELECT (SELECT count(*) FROM marked),
		       coalesce((SELECT array_agg(x::text) FROM unnest($1::%[3]s[]) x
		                 WHERE NOT EXISTS (SELECT 1 FROM %[1]s WHERE %[2]s = x)), '{}')`, table, id, typ)
	j.parkSQL = fmt.Sprintf(`UPDATE %s SET attempts = attempts + 1, last_error = left($2, 2000) WHERE %s = $1::%s AND published_at IS NULL`, table, id, typ)
	return j.markSQL, nil
}

// flushOnExit writes what is still queued, connecting if need be, within a
// few seconds, and closes the connection. What it cannot write stays
// unmarked: such rows may be published again after a slot recreation.
func (j *Janitor) flushOnExit(db *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	j.mu.Lock()
	idle := len(j.pending) == 0 && len(j.parked) == 0
	j.mu.Unlock()
	var err error
	if !idle {
		if db, err = j.conn(ctx, db); err == nil {
			err = j.flush(ctx, db)
		}
	}
	if err != nil {
		j.log.Warn("could not mark the last acked events published; they stay unmarked", "error", err)
	}
	if db != nil {
		_ = db.Close(ctx)
	}
}

// Pending returns how many acked ids wait to be marked (for tests).
func (j *Janitor) Pending() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.pending)
}
