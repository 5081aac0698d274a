package migrations

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// HOTFile is the optional migration that puts the outbox on the HOT
// layout (its comment says what that buys and costs).
const HOTFile = "optional/hot_marks.sql"

// unlessIndex is a directive line: the file is skipped when the table's
// schema holds an index of that name (rendered, a string literal).
var unlessIndex = regexp.MustCompile(`(?m)^-- cdcrelay:unless-index '((?:[^']|'')+)'$`)

// skipped reports whether sql (rendered) says to skip it for the table as
// it is: 0003's partial index is not built on the HOT layout.
func skipped(ctx context.Context, db *pgx.Conn, t config.Outbox, sql string) (bool, error) {
	m := unlessIndex.FindStringSubmatch(sql)
	if m == nil {
		return false, nil
	}
	var exists bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('i', 'I'))`,
		t.Schema, strings.ReplaceAll(m[1], "''", "'")).Scan(&exists)
	if err != nil {
		return false, fmt.Errorf("look up index %s: %w", m[1], err)
	}
	return exists, nil
}

// ApplyHOT runs the default migrations and then HOTFile, one statement at
// a time outside a transaction block (each concurrent build or drop must
// be alone), under the migration lock. It refuses a partitioned table,
// whose fillfactor and indexes are set per partition, and without a
// last_error column it leaves out the parked rows' index.
func ApplyHOT(ctx context.Context, db *pgx.Conn, t config.Outbox) error {
	if err := ApplyTo(ctx, db, t); err != nil {
		return err
	}
	table := pgx.Identifier{t.Schema, t.Table}.Sanitize()
	var partitioned, lastError bool
	err := db.QueryRow(ctx, `SELECT c.relkind = 'p', EXISTS (SELECT 1 FROM pg_attribute
			WHERE attrelid = c.oid AND attname = 'last_error' AND attnum > 0 AND NOT attisdropped)
		FROM pg_class c WHERE c.oid = $1::regclass`, table).Scan(&partitioned, &lastError)
	if err != nil {
		return fmt.Errorf("apply %s: look up %s: %w", HOTFile, table, err)
	}
	if partitioned {
		return fmt.Errorf("apply %s: %s is partitioned: set fillfactor and build the indexes of %s on each partition (docs/operations.md, \"The HOT layout\")", HOTFile, table, HOTFile)
	}
	sql, err := Render(HOTFile, t)
	if err != nil {
		return err
	}
	// The file names the indexes it drops unqualified, as they are
	// created: in the table's schema, first on the search_path here.
	var path string
	if err := db.QueryRow(ctx, `SELECT current_setting('search_path'), set_config('search_path', quote_ident($1), false)`, t.Schema).Scan(&path, new(string)); err != nil {
		return fmt.Errorf("apply %s: set search_path: %w", HOTFile, err)
	}
	defer func() {
		_, _ = db.Exec(context.WithoutCancel(ctx), `SELECT set_config('search_path', $1, false)`, path)
	}()
	for _, stmt := range Statements(sql) {
		if !lastError && strings.Contains(stmt, "last_error") {
			continue
		}
		if err := applyOutsideTransaction(ctx, db, t, stmt); err != nil {
			return fmt.Errorf("apply %s: %s: %w", HOTFile, firstLine(stmt), ownerHint(err))
		}
	}
	return hotBlockers(ctx, db, table)
}

// hotBlockers fails when an index of the table still names published_at
// (one of the service's own, say): while it exists no mark is heap-only.
func hotBlockers(ctx context.Context, db *pgx.Conn, table string) error {
	rows, err := db.Query(ctx, `SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i
		WHERE i.indrelid = $1::regclass AND pg_get_indexdef(i.indexrelid) ~ '\mpublished_at\M' ORDER BY 1`, table)
	if err != nil {
		return fmt.Errorf("apply %s: read the indexes of %s: %w", HOTFile, table, err)
	}
	defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("apply %s: read the indexes of %s: %w", HOTFile, table, err)
	}
	if len(defs) > 0 {
		return fmt.Errorf("apply %s: marks on %s cannot be heap-only while an index names published_at; drop it (DROP INDEX CONCURRENTLY) or keep the default layout: %s",
			HOTFile, table, strings.Join(defs, "; "))
	}
	return nil
}

// Statements splits a file into its statements, comments dropped: each
// ends with a semicolon at the end of a line (the files' convention; none
// of the optional files holds a PL/pgSQL body).
func Statements(sql string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--") || strings.TrimSpace(line) == "" {
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		if strings.HasSuffix(strings.TrimSpace(line), ";") {
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
