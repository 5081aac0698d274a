package preflight

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// checkMarks is the finding about what a mark costs the primary: a
// heap-only update, or a full one because an index names published_at
// (docs/operations.md, "The HOT layout").
const checkMarks = "marks"

// markFacts are the table's indexes and storage as marks see them.
type markFacts struct {
	blockers    []string // indexes naming published_at, by name
	unpublished bool     // a valid index on published_at IS NULL rows serves the monitor
	enqueued    bool     // a valid index on every row's enqueued_at
	fillfactor  int      // 100 when unset
}

// markFacts reads them.
func (s *session) markFacts(ctx context.Context) (markFacts, error) {
	var f markFacts
	table := pgx.Identifier{s.t.schema, s.t.table}.Sanitize()
	err := s.db.QueryRow(ctx, `
		SELECT coalesce(array_agg(c.relname::text ORDER BY c.relname) FILTER (WHERE pg_get_indexdef(i.indexrelid) ~ '\mpublished_at\M'), '{}'),
		       coalesce(bool_or(i.indisvalid AND pg_get_expr(i.indpred, i.indrelid) = '(published_at IS NULL)'), false),
		       coalesce(bool_or(i.indisvalid AND i.indpred IS NULL AND a.attname = 'enqueued_at'), false),
		       coalesce((SELECT substring(o FROM 12)::int FROM pg_class t, unnest(t.reloptions) o
		                 WHERE t.oid = $1::regclass AND o LIKE 'fillfactor=%'), 100)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = $1::regclass`, table).Scan(&f.blockers, &f.unpublished, &f.enqueued, &f.fillfactor)
	return f, err
}

// marks reads the facts and classifies them.
func (s *session) marks(ctx context.Context) Finding {
	f, err := s.markFacts(ctx)
	if err != nil {
		return failed(checkMarks, "read the indexes of "+s.t.qualified(), err)
	}
	return classifyMarks(s.t, f)
}

// classifyMarks: either layout is sound; the finding says which one the
// table has and what it costs. Without an index on unpublished rows and
// without one on enqueued_at, the monitor reads the whole table on every
// refresh: a warning.
func classifyMarks(t target, f markFacts) Finding {
	if len(f.blockers) > 0 {
		return Finding{Check: checkMarks, Message: fmt.Sprintf("marks are full updates (an index entry each) because %s names published_at: the default layout; `cdcrelay migrate -hot-marks` makes them heap-only once no polling drainer needs the unpublished rows' index (docs/operations.md, \"The HOT layout\")",
			strings.Join(f.blockers, ", "))}
	}
	if !f.unpublished && !f.enqueued {
		return Finding{Check: checkMarks, Severity: Warn,
			Message: fmt.Sprintf("no index on %s finds its unpublished rows or orders them by enqueued_at: the monitor reads the whole table on every refresh", t.qualified()),
			Remedy:  fmt.Sprintf("CREATE INDEX CONCURRENTLY IF NOT EXISTS %s ON %s (enqueued_at);", quoteIdent(t.table+"_enqueued_idx"), t.qualified())}
	}
	msg := fmt.Sprintf("marks can be heap-only updates: no index names published_at (the HOT layout), fillfactor %d", f.fillfactor)
	if f.fillfactor > 90 {
		msg += "; pages keep no room for them until vacuumed: ALTER TABLE " + t.qualified() + " SET (fillfactor = 50) for pages written from then on"
	}
	return Finding{Check: checkMarks, Message: msg}
}

// marksCheck judges the marks' layout, for a plain table.
func marksCheck(ctx context.Context, s *session) []Finding {
	if !s.tableErr.ok() || s.table.kind != "r" {
		return nil
	}
	return []Finding{s.marks(ctx)}
}
