package preflight

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// This file reads the publication for check: its settings, the tables it
// covers, and which of them share the outbox's partition or inheritance
// tree (those are refused; any other is foreign, and skipped).

// publication reads the publication and the tables it covers. Columns that
// newer servers add are read through to_jsonb, so one query fits all.
func (s *session) publication(ctx context.Context) (pubFacts, error) {
	p := pubFacts{canCreate: s.canCreatePublication}
	var raw []byte
	err := s.db.QueryRow(ctx, `SELECT to_jsonb(p) FROM pg_publication p WHERE pubname = $1`, s.t.publication).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, nil
	}
	if err != nil {
		return p, err
	}
	var row struct {
		AllTables bool   `json:"puballtables"`
		Insert    bool   `json:"pubinsert"`
		Update    bool   `json:"pubupdate"`
		Delete    bool   `json:"pubdelete"`
		Truncate  bool   `json:"pubtruncate"`
		ViaRoot   *bool  `json:"pubviaroot"`
		GenCols   string `json:"pubgencols"` // PostgreSQL 18: "s" stored, "n" none
	}
	if err := json.Unmarshal(raw, &row); err != nil {
		return p, fmt.Errorf("decode pg_publication row: %w", err)
	}
	p.genColsStored = row.GenCols == "s"
	p.exists, p.allTables = true, row.AllTables
	p.insert, p.update, p.delete, p.truncate = row.Insert, row.Update, row.Delete, row.Truncate
	p.viaRoot = row.ViaRoot != nil && *row.ViaRoot

	// Without publish_via_partition_root a partitioned outbox is listed as
	// its partitions: they count as the outbox (partOfOutbox), for the
	// partition check to name the remedy.
	rows, err := s.db.Query(ctx, `
		SELECT to_jsonb(pt), coalesce(pg_partition_root(c.oid) = to_regclass($2) AND c.oid <> to_regclass($2), false), coalesce(c.oid, 0)
		FROM pg_publication_tables pt
		LEFT JOIN pg_namespace n ON n.nspname = pt.schemaname
		LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
		WHERE pubname = $1 ORDER BY pt.schemaname, pt.tablename`, s.t.publication, pgx.Identifier{s.t.schema, s.t.table}.Sanitize())
	if err != nil {
		return p, fmt.Errorf("read pg_publication_tables: %w", err)
	}
	defer rows.Close()
	others := map[uint32]string{}
	for rows.Next() {
		var partOfOutbox bool
		var oid uint32
		if err := rows.Scan(&raw, &partOfOutbox, &oid); err != nil {
			return p, fmt.Errorf("read pg_publication_tables: %w", err)
		}
		if partOfOutbox {
			p.covers = true
			continue
		}
		var pt struct {
			Schema    string   `json:"schemaname"`
			Table     string   `json:"tablename"`
			Columns   []string `json:"attnames"`  // PostgreSQL 15+
			RowFilter *string  `json:"rowfilter"` // PostgreSQL 15+
		}
		if err := json.Unmarshal(raw, &pt); err != nil {
			return p, fmt.Errorf("decode pg_publication_tables row: %w", err)
		}
		if pt.Schema != s.t.schema || pt.Table != s.t.table {
			p.others = append(p.others, pt.Schema+"."+pt.Table)
			others[oid] = pt.Schema + "." + pt.Table
			continue
		}
		p.covers, p.columns = true, pt.Columns
		if pt.RowFilter != nil {
			p.rowFilter = *pt.RowFilter
		}
	}
	if err := rows.Err(); err != nil {
		return p, fmt.Errorf("read pg_publication_tables: %w", err)
	}
	p.kin, err = s.kin(ctx, others)
	return p, err
}

// kin returns, by name, those of others (OID to schema.table) that share
// a partition or inheritance tree with the outbox: run refuses them, and
// skips the inserts of the rest (slot.CheckPublication).
func (s *session) kin(ctx context.Context, others map[uint32]string) ([]string, error) {
	if len(others) == 0 {
		return nil, nil
	}
	var outbox uint32
	if err := s.db.QueryRow(ctx, `SELECT coalesce(to_regclass($1)::oid, 0)`, pgx.Identifier{s.t.schema, s.t.table}.Sanitize()).Scan(&outbox); err != nil {
		return nil, fmt.Errorf("look up %s: %w", s.t.qualified(), err)
	}
	if outbox == 0 {
		return nil, nil
	}
	oids := make([]uint32, 0, len(others))
	for oid := range others {
		oids = append(oids, oid)
	}
	kin, err := slot.Kin(ctx, s.db, outbox, oids)
	if err != nil {
		return nil, err
	}
	var names []string
	for oid, name := range others {
		if kin[oid] {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}
