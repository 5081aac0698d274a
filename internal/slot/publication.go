package slot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// ErrPublication means the publication does not carry the outbox table's
// inserts as the relay needs (or carries a relation of the outbox's tree,
// whose rows may be outbox rows under another name), or the table is not
// where the configuration says. The
// relay refuses to stream rather than confirm past rows it cannot
// classify (invariant 9, docs/architecture.md); no retry can fix it.
var ErrPublication = errors.New("the publication does not publish the outbox table as the relay needs")

// Relation is a table as the catalog knows it.
type Relation struct {
	OID          uint32
	Schema, Name string
	Kind         string // pg_class.relkind: r (table), p (partitioned table), …
}

// Qualified is the relation's name as SQL, each part quoted.
func (r Relation) Qualified() string { return pgx.Identifier{r.Schema, r.Name}.Sanitize() }

// TableFacts is what the catalog says about the configured outbox table.
type TableFacts struct {
	// Relation is the table as configured, with its OID and Kind when it
	// exists; Kind is "" when no such relation exists.
	Relation
	// Database and Role are the session's current_database() and
	// current_user, which the problems name.
	Database, Role string
}

// PublicationFacts is what the catalog says about a publication.
type PublicationFacts struct {
	Exists    bool
	AllTables bool // FOR ALL TABLES
	Insert    bool // publish includes insert
	// Update, Delete, Truncate: publish includes them too (decoded and
	// sent for nothing).
	Update, Delete, Truncate bool
	ViaRoot                  bool // publish_via_partition_root
	// GenColsStored is publish_generated_columns = stored (PostgreSQL
	// 18): stored generated columns are sent like the others.
	GenColsStored bool
	// CanCreate: the role owns the table and may CREATE in the database,
	// so a missing publication is created at start. Only check fills it:
	// the relay judges the publication after creating it if it could.
	CanCreate bool
	// Tables are the relations whose changes pgoutput sends, under the OID
	// and name it sends them with (pg_publication_tables): a partitioned
	// table's root with publish_via_partition_root, its partitions without.
	Tables []Relation
	// Kin holds the OIDs of Tables that share a partition or inheritance
	// tree with the outbox table; Parts those that are its partitions.
	Kin, Parts map[uint32]bool
	// RowFilter and Columns are the outbox's row filter and published
	// columns (PostgreSQL 15+; "" and nil when unknown).
	RowFilter string
	Columns   []string
}

// Columns maps each mapped column the table has to its
// pg_attribute.attgenerated: "" plain, "s" stored, "v" virtual.
type Columns map[string]string

// readTable looks the configured table up by its quoted name.
func readTable(ctx context.Context, db *pgx.Conn, t config.Outbox) (TableFacts, error) {
	tf := TableFacts{Relation: Relation{Schema: t.Schema, Name: t.Table}}
	err := db.QueryRow(ctx, `
		SELECT current_database(), current_user, coalesce(c.oid, 0), coalesce(c.relkind::text, '')
		FROM (SELECT to_regclass($1) AS r) x LEFT JOIN pg_class c ON c.oid = x.r`, tf.Qualified()).
		Scan(&tf.Database, &tf.Role, &tf.OID, &tf.Kind)
	if err != nil {
		return tf, fmt.Errorf("look up table %s: %w", tf.Qualified(), err)
	}
	return tf, nil
}

// ReadPublication reads the publication, the relations it publishes, and
// how they relate to the outbox table tf. The catalog rows are read
// through to_jsonb so that one query fits every server version
// (pubviaroot is PostgreSQL 13+, attnames and rowfilter 15+:
// pgcaps.Caps.PublicationColumnLists; pubgencols 18+:
// pgcaps.Caps.PublishesGenerated).
func ReadPublication(ctx context.Context, db *pgx.Conn, name string, tf TableFacts) (PublicationFacts, error) {
	var p PublicationFacts
	var raw []byte
	err := db.QueryRow(ctx, `SELECT to_jsonb(p) FROM pg_publication p WHERE pubname = $1`, name).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("look up publication %s: %w", name, err)
	}
	var row struct {
		AllTables bool   `json:"puballtables"`
		Insert    bool   `json:"pubinsert"`
		Update    bool   `json:"pubupdate"`
		Delete    bool   `json:"pubdelete"`
		Truncate  bool   `json:"pubtruncate"`
		ViaRoot   *bool  `json:"pubviaroot"`
		GenCols   string `json:"pubgencols"` // PostgreSQL 18 (PublishesGenerated): "s" stored, "n" none
	}
	if err := json.Unmarshal(raw, &row); err != nil {
		return p, fmt.Errorf("decode pg_publication row: %w", err)
	}
	p.Exists, p.AllTables, p.Insert = true, row.AllTables, row.Insert
	p.Update, p.Delete, p.Truncate = row.Update, row.Delete, row.Truncate
	p.ViaRoot = row.ViaRoot != nil && *row.ViaRoot
	p.GenColsStored = row.GenCols == "s"
	if err := p.readTables(ctx, db, name, tf.OID); err != nil {
		return p, fmt.Errorf("read the tables of publication %s: %w", name, err)
	}
	if tf.Kind != "" && len(p.Tables) > 0 {
		if p.Kin, p.Parts, err = tree(ctx, db, tf.OID, p.OIDs()); err != nil {
			return p, err
		}
	}
	return p, nil
}

// readTables reads pg_publication_tables: every relation, and the
// outbox's (OID table) row filter and column list.
func (p *PublicationFacts) readTables(ctx context.Context, db *pgx.Conn, name string, table uint32) error {
	rows, err := db.Query(ctx, `
		SELECT c.oid, pt.schemaname::text, pt.tablename::text, c.relkind::text, to_jsonb(pt)
		FROM pg_publication_tables pt
		JOIN pg_namespace n ON n.nspname = pt.schemaname
		JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
		WHERE pt.pubname = $1
		ORDER BY 2, 3`, name)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var rel Relation
		var raw []byte
		if err := rows.Scan(&rel.OID, &rel.Schema, &rel.Name, &rel.Kind, &raw); err != nil {
			return err
		}
		p.Tables = append(p.Tables, rel)
		if rel.OID != table {
			continue
		}
		var pt struct {
			Columns   []string `json:"attnames"`  // PostgreSQL 15+: PublicationColumnLists
			RowFilter *string  `json:"rowfilter"` // PostgreSQL 15+: PublicationColumnLists
		}
		if err := json.Unmarshal(raw, &pt); err != nil {
			return fmt.Errorf("decode pg_publication_tables row: %w", err)
		}
		p.Columns = pt.Columns
		if pt.RowFilter != nil {
			p.RowFilter = *pt.RowFilter
		}
	}
	return rows.Err()
}

// readColumns returns those of names that are columns of table, each with
// its attgenerated.
func readColumns(ctx context.Context, db *pgx.Conn, table Relation, names []string) (Columns, error) {
	rows, err := db.Query(ctx, `
		SELECT attname::text, attgenerated::text FROM pg_attribute
		WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attname = ANY($2)`, table.OID, names)
	if err != nil {
		return nil, fmt.Errorf("read the columns of %s: %w", table.Qualified(), err)
	}
	cols := Columns{}
	var name, generated string
	_, err = pgx.ForEachRow(rows, []any{&name, &generated}, func() error {
		cols[name] = generated
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the columns of %s: %w", table.Qualified(), err)
	}
	return cols, nil
}

// VerifyPublication judges at session start the table, the publication
// and, of mapped (the configured columns: id, routing key and payload,
// then the optional ones; empty ones are skipped), those pgoutput would
// not send (TableProblems, PublicationProblems, GeneratedProblems): the
// first fatal problem is its error. It returns the table, whose OID the
// decoder maps the outbox by, and the foreign relations the publication
// also publishes, whose inserts the decoder skips.
func VerifyPublication(ctx context.Context, db *pgx.Conn, t config.Outbox, mapped ...string) (Relation, []Relation, error) {
	n := min(3, len(mapped))
	m := Mapped{Required: mapped[:n], Optional: mapped[n:]}
	tf, err := readTable(ctx, db, t)
	if err != nil {
		return tf.Relation, nil, err
	}
	p, err := ReadPublication(ctx, db, t.Publication, tf)
	if err != nil {
		return tf.Relation, nil, err
	}
	var cols Columns
	if tf.Kind != "" {
		if cols, err = readColumns(ctx, db, tf.Relation, m.all()); err != nil {
			return tf.Relation, nil, err
		}
	}
	s := Scope{Outbox: t}
	if err := refusal(TableProblems(s, tf, p), PublicationProblems(s, tf, p, cols, m), GeneratedProblems(s, p, cols, m)); err != nil {
		return tf.Relation, nil, err
	}
	_, _, foreign := split(tf, p)
	return tf.Relation, foreign, nil
}

// OIDs are the OIDs of the publication's relations.
func (p PublicationFacts) OIDs() []uint32 {
	oids := make([]uint32, 0, len(p.Tables))
	for _, rel := range p.Tables {
		oids = append(oids, rel.OID)
	}
	return oids
}

// tree returns those of oids that share a partition or inheritance tree
// with the relation table (kin): any relation whose ancestors (pg_inherits,
// which holds partitions too, followed to the top) meet the table's; and
// those that are partitions of the table at any depth (parts).
func tree(ctx context.Context, db *pgx.Conn, table uint32, oids []uint32) (kin, parts map[uint32]bool, err error) {
	rows, err := db.Query(ctx, `
		WITH RECURSIVE up(rel, anc) AS (
			SELECT o, o FROM unnest($1::oid[]) o
			UNION
			SELECT up.rel, i.inhparent FROM up JOIN pg_inherits i ON i.inhrelid = up.anc)
		SELECT rel, coalesce(bool_or(anc = $2::oid AND rel <> $2::oid) AND (SELECT relispartition FROM pg_class WHERE oid = rel), false)
		FROM up GROUP BY rel
		HAVING bool_or(anc IN (SELECT anc FROM up WHERE rel = $2::oid))`, append([]uint32{table}, oids...), table)
	if err != nil {
		return nil, nil, fmt.Errorf("read the partition and inheritance trees of the publication: %w", err)
	}
	kin, parts = map[uint32]bool{}, map[uint32]bool{}
	var oid uint32
	var part bool
	_, err = pgx.ForEachRow(rows, []any{&oid, &part}, func() error {
		kin[oid], parts[oid] = oid != table, part
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read the partition and inheritance trees of the publication: %w", err)
	}
	return kin, parts, nil
}

// ClassifyLeftovers classifies, from the catalog, relations that ended an
// earlier session as unknown (an insert from a relation added to the
// publication after that session started) but that the publication no
// longer lists, while their inserts may still lie ahead in the slot: each
// one that exists and shares no tree with table is foreign (returned);
// one of the table's tree, or one that no longer exists, cannot be told
// from the outbox, so the relay stops (ErrPublication) before anything
// past it is confirmed. seen maps each OID to the name it was seen under.
func ClassifyLeftovers(ctx context.Context, db *pgx.Conn, table Relation, seen map[uint32]string) ([]Relation, error) {
	oids := make([]uint32, 0, len(seen))
	for oid := range seen {
		oids = append(oids, oid)
	}
	slices.Sort(oids)
	kin, _, err := tree(ctx, db, table.OID, oids)
	if err != nil {
		return nil, err
	}
	var foreign []Relation
	for _, oid := range oids {
		rel := Relation{OID: oid}
		err := db.QueryRow(ctx, `SELECT n.nspname::text, c.relname::text, c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1`,
			oid).Scan(&rel.Schema, &rel.Name, &rel.Kind)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil, fmt.Errorf("%w: an insert into %s (relation %d), which the publication published for a while, lies ahead in the slot, and that relation no longer exists, so the relay cannot tell it from the outbox %s; nothing past it was confirmed: "+
				"if it was certainly not the outbox, advance the slot past its transaction (pg_replication_slot_advance) once the outbox rows committed with it are published (published_at set)",
				ErrPublication, seen[oid], oid, table.Qualified())
		case err != nil:
			return nil, fmt.Errorf("look up relation %d: %w", oid, err)
		case kin[oid] || oid == table.OID:
			return nil, fmt.Errorf("%w: an insert into %s (relation %d), of the same partition or inheritance tree as the outbox %s, lies ahead in the slot: its rows may be outbox rows under another name, so the relay stops before it; publish the outbox through its root (publish_via_partition_root = true) and only it",
				ErrPublication, rel.Qualified(), oid, table.Qualified())
		}
		foreign = append(foreign, rel)
	}
	return foreign, nil
}

// createPublicationSQL is the statement that creates the publication for
// table: inserts only, and for a partitioned table through its root, so
// that every partition's rows arrive as the table's own.
func createPublicationSQL(pub string, table Relation) string {
	return fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert'%s)`,
		pgx.Identifier{pub}.Sanitize(), table.Qualified(), viaRootOption(table.Kind))
}

// PublicationNamesArg is pgoutput's publication_names option for one
// publication: a string literal holding the quoted name, since the server
// reads it as an identifier list (unquoted names would be folded).
func PublicationNamesArg(pub string) string {
	return "'" + strings.ReplaceAll(pgx.Identifier{pub}.Sanitize(), "'", "''") + "'"
}
