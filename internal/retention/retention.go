// Package retention deletes old published outbox rows. It is a stage of
// its own, beside the janitor: it has its own connection, opened only for
// a run and closed after it, so marking never waits for it and a hot
// standby holds no idle backend for it.
//
// A row is deleted once its published_at and its enqueued_at are both
// older than the retention. A row is published after it is enqueued, so
// that is the documented promise (published_at older than the retention);
// a row whose clock says otherwise is kept longer, never deleted early.
// Rows with published_at NULL (unpublished, or parked as poison) are never
// deleted.
package retention

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/config"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
)

// Options configure a Retention.
type Options struct {
	DatabaseURL string
	// Origin, when set, is the replication origin retention's
	// transactions carry (PostgreSQL 16+, with the grants), so that the
	// relay's stream skips its DELETEs undecoded.
	Origin string
	// Outbox is the table whose published rows are deleted; its Slot is
	// the constant label of the run metrics.
	config.Outbox
	Retention time.Duration // published rows older than this are deleted
	Interval  time.Duration // time between the end of a run and the next
	Batch     int           // most rows per DELETE
	// FirstDelay is how long the relay must have been active before the
	// first run. Zero means a random 10-30 s (spreading the relays of many
	// databases), or Interval if that is shorter.
	FirstDelay time.Duration
	// Active reports whether this process streams the slot (or adopts it).
	// Retention runs only then, and stops between batches when it ends, so
	// a hot standby runs no statement.
	Active func() bool
}

// Retention is a stage that runs a retention pass shortly after the relay
// becomes active and then every Interval.
type Retention struct {
	opts Options
	log  *slog.Logger
	m    *metrics
	// warned holds the degradations already logged, so each is logged once
	// per process. Only the Run goroutine uses it.
	warned map[string]bool
}

// New returns a Retention with its metrics registered with reg.
func New(opts Options, log *slog.Logger, reg prometheus.Registerer) *Retention {
	return &Retention{opts: opts, log: log, m: newMetrics(reg, opts.Slot), warned: map[string]bool{}}
}

// Run runs retention passes until ctx ends. A failed pass is logged and
// counted and tried again after retryAfter (or Interval if shorter); it
// never stops the relay.
func (r *Retention) Run(ctx context.Context) error {
	// Looking at Active is an atomic read, not a statement.
	poll := time.NewTicker(max(10*time.Millisecond, min(time.Second, r.opts.Interval)))
	defer poll.Stop()
	var next time.Time // zero while the relay is not active
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-poll.C:
		}
		if !r.active() {
			next = time.Time{}
			continue
		}
		if next.IsZero() {
			next = time.Now().Add(r.firstDelay())
		}
		if time.Now().Before(next) {
			continue
		}
		wait := r.opts.Interval
		if !r.pass(ctx) {
			wait = min(wait, retryAfter)
		}
		next = time.Now().Add(wait)
	}
}

// retryAfter is how soon a failed pass (the database restarting, a
// statement timeout) is tried again.
const retryAfter = time.Minute

// pass runs one retention pass and records its outcome; false if it failed.
func (r *Retention) pass(ctx context.Context) bool {
	began := time.Now()
	n, err := r.runOnce(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.m.errors.Inc()
			r.log.Warn("retention failed; will retry", "error", err, "deleted", n, "retry_in", min(r.opts.Interval, retryAfter))
		}
		return false
	}
	r.m.runs.Inc()
	r.m.lastRun.Set(float64(time.Now().Unix()))
	level := slog.LevelDebug
	if n > 0 {
		level = slog.LevelInfo
	}
	r.log.Log(ctx, level, "retention deleted old published rows", "deleted", n, "took", time.Since(began).Round(time.Millisecond))
	return true
}

func (r *Retention) firstDelay() time.Duration {
	if r.opts.FirstDelay > 0 {
		return r.opts.FirstDelay
	}
	return min(r.opts.Interval, 10*time.Second+rand.N(20*time.Second))
}

func (r *Retention) active() bool { return r.opts.Active == nil || r.opts.Active() }

// statementTimeout bounds each retention statement: a batch touches at
// most Batch rows, so one that runs this long is stuck, not busy.
const statementTimeout = time.Minute

// connect opens the pass's connection.
func (r *Retention) connect(ctx context.Context) (*pgx.Conn, error) {
	o := pgconnect.Options{Force: map[string]string{
		// Always its own name, so that its backends are told apart.
		"application_name":  pgconnect.ApplicationName + " retention",
		"statement_timeout": strconv.FormatInt(statementTimeout.Milliseconds(), 10),
	}}
	if r.opts.Origin != "" {
		o.Setup = func(ctx context.Context, db *pgx.Conn) error {
			_, err := pgconnect.SetupOrigin(ctx, db, r.opts.Origin)
			return err
		}
	}
	return pgconnect.Connect(ctx, r.opts.DatabaseURL, "to database for retention", o)
}

// runOnce connects, deletes every expired published row in batches and
// closes the connection. It returns the rows deleted.
func (r *Retention) runOnce(ctx context.Context) (int64, error) {
	db, err := r.connect(ctx)
	if err != nil {
		return 0, err
	}
	defer pgconnect.Close(ctx, db)
	s, err := r.inspect(ctx, db)
	if err != nil {
		return 0, err
	}
	if s.indexed() {
		return r.byIndex(ctx, db)
	}
	r.warnOnce(s)
	return r.byBlocks(ctx, db, s.enqueuedAt)
}

// shape is what retention needs to know about the table.
type shape struct {
	enqueuedAt bool // the table has an enqueued_at column
	index      bool // an index on (enqueued_at) covers published rows
}

func (s shape) indexed() bool { return s.enqueuedAt && s.index }

func (r *Retention) table() string { return pgx.Identifier{r.opts.Schema, r.opts.Table}.Sanitize() }

// inspect reads whether the table has enqueued_at and a usable index on
// it: a valid index whose first column is enqueued_at, either on every row
// or on the published ones (the unpublished-rows index does not help).
func (r *Retention) inspect(ctx context.Context, db *pgx.Conn) (shape, error) {
	var s shape
	err := db.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'enqueued_at' AND attnum > 0 AND NOT attisdropped),
		       EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		               WHERE i.indrelid = $1::regclass AND a.attname = 'enqueued_at' AND i.indisvalid
		                 AND (i.indpred IS NULL OR pg_get_expr(i.indpred, i.indrelid) = '(published_at IS NOT NULL)'))`,
		r.table()).Scan(&s.enqueuedAt, &s.index)
	if err != nil {
		return s, fmt.Errorf("inspect %s: %w", r.table(), err)
	}
	return s, nil
}

// warnOnce says, once per process, why retention walks the whole table.
func (r *Retention) warnOnce(s shape) {
	key, msg := "index", fmt.Sprintf("retention: %s has no index on (enqueued_at) WHERE published_at IS NOT NULL; each run reads the whole table in bounded block ranges instead of only the expired rows (apply migrations/0003_retention_index.sql)", r.table())
	if !s.enqueuedAt {
		key, msg = "column", fmt.Sprintf("retention: %s has no enqueued_at column; each run reads the whole table in bounded block ranges, deleting rows by published_at alone", r.table())
	}
	if !r.warned[key] {
		r.warned[key] = true
		r.log.Warn(msg)
	}
}

// indexSelectSQL finds the next batch of expired published rows at or
// after the cursor $1, in enqueued_at order. The index scan starts at the
// cursor, so a batch reads about the rows it deletes however many batches
// came before it. The cursor is inclusive: rows sharing a timestamp across
// a batch boundary are not skipped, and rows already deleted are not found
// again.
func (r *Retention) indexSelectSQL() string {
	return fmt.Sprintf(`SELECT tableoid, ctid, enqueued_at FROM %s
			WHERE enqueued_at >= $1::timestamptz AND enqueued_at < now() - $2::interval
			  AND published_at IS NOT NULL AND published_at < now() - $2::interval
			ORDER BY enqueued_at LIMIT $3`, r.table())
}

// indexBatchSQL deletes the batch indexSelectSQL finds and returns the
// rows found, the rows deleted and the batch's last enqueued_at (the next
// cursor). The DELETE checks the predicate again: a row changed since the
// batch was read is left alone. It finds the rows by ctid (a TID scan) and
// tableoid: in a partitioned table a ctid alone names a row in every
// partition.
func (r *Retention) indexBatchSQL() string {
	return fmt.Sprintf(`WITH batch AS MATERIALIZED (%[2]s),
		gone AS (
			DELETE FROM %[1]s WHERE ctid = ANY(ARRAY(SELECT ctid FROM batch))
			  AND (tableoid, ctid) IN (SELECT tableoid, ctid FROM batch)
			  AND published_at IS NOT NULL AND published_at < now() - $2::interval
			RETURNING 1)
		SELECT (SELECT count(*) FROM batch), (SELECT count(*) FROM gone), (SELECT max(enqueued_at)::timestamptz FROM batch)`,
		r.table(), r.indexSelectSQL())
}

// oldest is the cursor of a pass's first batch.
var oldest = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}

// byIndex deletes in batches along the enqueued_at index, each batch its
// own short transaction, until a batch comes back short.
func (r *Retention) byIndex(ctx context.Context, db *pgx.Conn) (int64, error) {
	sql := r.indexBatchSQL()
	cursor := oldest
	var total int64
	for r.active() {
		var found, deleted int64
		var last pgtype.Timestamptz
		if err := db.QueryRow(ctx, sql, cursor, r.opts.Retention, r.opts.Batch).Scan(&found, &deleted, &last); err != nil {
			return total, fmt.Errorf("delete published rows older than %s: %w", r.opts.Retention, err)
		}
		total += deleted
		r.m.deleted.Add(float64(deleted))
		if found < int64(r.opts.Batch) || !last.Valid {
			return total, nil
		}
		cursor = last
	}
	return total, nil
}

// byBlocks is the fallback without the index: it walks the table's blocks
// in ranges of about Batch rows (a TID range scan, PostgreSQL 14+), so each
// batch reads a bounded number of blocks; a pass reads the whole table
// once. Rows added during the pass land past its end or in space freed by
// vacuum; both are new, so none is expired.
func (r *Retention) byBlocks(ctx context.Context, db *pgx.Conn, enqueuedAt bool) (int64, error) {
	blocks, perBatch, err := r.blocks(ctx, db)
	if err != nil {
		return 0, err
	}
	sql := r.blockBatchSQL(enqueuedAt)
	var total int64
	for lo := int64(0); lo < blocks && r.active(); lo += perBatch {
		tag, err := db.Exec(ctx, sql, tid(lo), tid(lo+perBatch), r.opts.Retention)
		if err != nil {
			return total, fmt.Errorf("delete published rows older than %s (blocks %d-%d): %w", r.opts.Retention, lo, lo+perBatch, err)
		}
		total += tag.RowsAffected()
		r.m.deleted.Add(float64(tag.RowsAffected()))
	}
	return total, nil
}

// blockBatchSQL deletes the expired published rows in the blocks from $1
// up to $2: by the same predicate as the index walk, or by published_at
// alone when the table has no enqueued_at.
func (r *Retention) blockBatchSQL(enqueuedAt bool) string {
	also := ""
	if enqueuedAt {
		also = "AND enqueued_at < now() - $3::interval"
	}
	return fmt.Sprintf(`DELETE FROM %s WHERE ctid >= $1::tid AND ctid < $2::tid
		AND published_at IS NOT NULL AND published_at < now() - $3::interval %s`, r.table(), also)
}

func tid(block int64) string { return fmt.Sprintf("(%d,0)", block) }

// blocks reads the size of the table's largest heap (the table itself, or
// its largest partition: a TID range applies to each) and how many blocks
// hold about Batch rows.
func (r *Retention) blocks(ctx context.Context, db *pgx.Conn) (blocks, perBatch int64, err error) {
	var rowsPerBlock float64
	err = db.QueryRow(ctx, `
		SELECT coalesce(max(pg_relation_size(c.oid)) / current_setting('block_size')::int, 0),
		       coalesce(sum(greatest(c.reltuples, 0)) / nullif(sum(c.relpages), 0), 0)
		FROM pg_class c
		WHERE c.relkind IN ('r', 'm') AND (c.oid = $1::regclass
		      OR c.oid IN (SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf))`, r.table()).Scan(&blocks, &rowsPerBlock)
	if err != nil {
		return 0, 0, fmt.Errorf("read the size of %s: %w", r.table(), err)
	}
	if rowsPerBlock < 1 {
		rowsPerBlock = 50 // never analyzed: a typical outbox row is 100-200 bytes
	}
	return blocks, max(1, int64(float64(r.opts.Batch)/rowsPerBlock)), nil
}
