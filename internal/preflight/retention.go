package preflight

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// checkRetention is the finding about what the outbox table offers the
// backlog-age gauge and retention: the enqueued_at column and an index on it.
const checkRetention = "retention"

// enqueuedAtColumn is the column the backlog's age and retention's index
// walk are read from.
const enqueuedAtColumn = "enqueued_at"

// retentionIndex reports whether the table has a valid index whose first
// column is enqueued_at, on every row or on the published ones: what the
// retention stage walks (migrations/0003_retention_index.sql creates one).
func (s *session) retentionIndex(ctx context.Context) (bool, error) {
	var ok bool
	err := s.db.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		               WHERE i.indrelid = $1::regclass AND a.attname = $2 AND i.indisvalid
		                 AND (i.indpred IS NULL OR pg_get_expr(i.indpred, i.indrelid) = '(published_at IS NOT NULL)'))`,
		pgx.Identifier{s.t.schema, s.t.table}.Sanitize(), enqueuedAtColumn).Scan(&ok)
	return ok, err
}

// retention reads the index and classifies the table for retention.
func (s *session) retention(ctx context.Context, tf tableFacts) Finding {
	indexed, err := s.retentionIndex(ctx)
	if err != nil {
		return failed(checkRetention, "read the indexes of "+s.t.qualified(), err)
	}
	return classifyRetention(s.t, tf, indexed)
}

// classifyRetention: without enqueued_at the backlog's age cannot be known
// (the gauge is NaN) and retention reads the whole table every run; without
// the index only the latter.
func classifyRetention(t target, tf tableFacts, indexed bool) Finding {
	index := fmt.Sprintf("CREATE INDEX CONCURRENTLY IF NOT EXISTS %s ON %s (enqueued_at) WHERE published_at IS NOT NULL;",
		quoteIdent(t.table+"_published_idx"), t.qualified())
	if _, ok := tf.column(enqueuedAtColumn); !ok {
		return Finding{Check: checkRetention, Severity: Warn,
			Message: fmt.Sprintf("%s has no enqueued_at column: cdcrelay_oldest_unpublished_age_seconds is NaN (alert on cdcrelay_outbox_unpublished instead) and retention reads the whole table on every run, deleting by published_at alone", t.qualified()),
			Remedy:  fmt.Sprintf("ALTER TABLE %s ADD COLUMN enqueued_at timestamptz NOT NULL DEFAULT now(); then %s", t.qualified(), index)}
	}
	if !indexed {
		return Finding{Check: checkRetention, Severity: Warn,
			Message: fmt.Sprintf("%s has no index on (enqueued_at) for published rows: retention reads the whole table on every run instead of only the expired rows", t.qualified()),
			Remedy:  index + " (migrations/0003_retention_index.sql)"}
	}
	return Finding{Check: checkRetention, Message: "enqueued_at is indexed: retention reads only the expired rows"}
}

// retentionCheck judges what the retention stage walks, for a table.
func retentionCheck(ctx context.Context, s *session) []Finding {
	if !s.tableErr.ok() || (s.table.kind != "r" && s.table.kind != "p") {
		return nil
	}
	return []Finding{s.retention(ctx, s.table)}
}
