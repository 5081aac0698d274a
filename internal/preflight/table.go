package preflight

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// This file checks the outbox table: that it exists, and its columns
// against the mapping and the park columns.

// readTable reads the outbox table, its columns and the role's grants on it
// (into r). A non-OK Finding means it could not.
func (s *session) readTable(ctx context.Context, r *roleFacts) (tableFacts, Finding) {
	var tf tableFacts
	var owns, createDB bool
	err := s.db.QueryRow(ctx, `
		SELECT c.oid, c.relkind::text, pg_get_userbyid(c.relowner),
		       pg_has_role(c.relowner, 'USAGE'), has_database_privilege(current_database(), 'CREATE'),
		       has_schema_privilege(n.oid, 'USAGE'),
		       has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'DELETE')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2`, s.t.schema, s.t.table).
		Scan(&tf.oid, &tf.kind, &tf.owner, &owns, &createDB, &r.schemaUsage, &r.selectPriv, &r.deletePriv)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return tf, Finding{}
	case err != nil:
		return tf, failed(checkTable, "look up table "+s.t.qualified(), err)
	}
	r.tableExists = true
	s.canCreatePublication = owns && createDB
	rows, err := s.db.Query(ctx, `
		SELECT a.attname, format_type(a.atttypid, a.atttypmod), coalesce(bt.typname, t.typname)::text, a.attnotnull,
		       has_column_privilege(a.attrelid, a.attnum, 'UPDATE'), a.attgenerated::text
		FROM pg_attribute a
		JOIN pg_type t ON t.oid = a.atttypid
		LEFT JOIN pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, tf.oid)
	if err != nil {
		return tf, failed(checkTable, "read the columns of "+s.t.qualified(), err)
	}
	for rows.Next() {
		var c column
		var update bool
		var generated string
		if err := rows.Scan(&c.name, &c.typ, &c.base, &c.notNull, &update, &generated); err != nil {
			rows.Close()
			return tf, failed(checkTable, "read the columns of "+s.t.qualified(), err)
		}
		switch c.name {
		case publishedAtColumn:
			r.hasPublishedAt, r.updatePublishedAt = true, update
		case "attempts", "last_error":
			if !update {
				r.cannotPark = append(r.cannotPark, c.name)
			}
		}
		tf.columns = append(tf.columns, c)
		if generated != "" {
			if tf.generated == nil {
				tf.generated = map[string]string{}
			}
			tf.generated[c.name] = generated
		}
	}
	if err := rows.Err(); err != nil {
		return tf, failed(checkTable, "read the columns of "+s.t.qualified(), err)
	}
	return tf, Finding{}
}

func loadTable(ctx context.Context, s *session) { s.table, s.tableErr = s.readTable(ctx, &s.role) }

// tableCheck judges the table and, for a table, its columns.
func tableCheck(_ context.Context, s *session) []Finding {
	if !s.tableErr.ok() {
		return []Finding{s.tableErr}
	}
	fs := []Finding{classifyTable(s.t, s.table)}
	if s.table.kind == "r" || s.table.kind == "p" {
		fs = append(fs, classifyColumns(s.t, s.table)...)
		fs = append(fs, classifyParkColumns(s.t, s.table)...)
	}
	return fs
}
