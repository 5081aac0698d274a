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

// PublicationFacts is what the catalog says about a publication.
type PublicationFacts struct {
	Exists    bool
	AllTables bool // FOR ALL TABLES
	Insert    bool // publish includes insert
	ViaRoot   bool // publish_via_partition_root
	// GenColsStored is publish_generated_columns = stored (PostgreSQL
	// 18): stored generated columns are sent like the others.
	GenColsStored bool
	// Tables are the relations whose changes pgoutput sends, under the OID
	// and name it sends them with (pg_publication_tables): a partitioned
	// table's root with publish_via_partition_root, its partitions without.
	Tables []Relation
	// Kin holds the OIDs of Tables that share a partition or inheritance
	// tree with the outbox table (filled by Kin, not ReadPublication).
	Kin map[uint32]bool
}

// ResolveTable finds the configured table by its quoted name; ok is false
// when no such relation exists.
func ResolveTable(ctx context.Context, db *pgx.Conn, t config.Outbox) (rel Relation, ok bool, err error) {
	rel = Relation{Schema: t.Schema, Name: t.Table}
	err = db.QueryRow(ctx, `SELECT c.oid, c.relkind::text FROM pg_class c WHERE c.oid = to_regclass($1)`,
		rel.Qualified()).Scan(&rel.OID, &rel.Kind)
	if errors.Is(err, pgx.ErrNoRows) {
		return rel, false, nil
	}
	if err != nil {
		return rel, false, fmt.Errorf("look up table %s: %w", rel.Qualified(), err)
	}
	return rel, true, nil
}

// ReadPublication reads the publication and the relations it publishes.
// The pg_publication row is read through to_jsonb so that one query fits
// every server version (pubviaroot is PostgreSQL 13+).
func ReadPublication(ctx context.Context, db *pgx.Conn, name string) (PublicationFacts, error) {
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
		ViaRoot   *bool  `json:"pubviaroot"`
		GenCols   string `json:"pubgencols"` // PostgreSQL 18: "s" stored, "n" none
	}
	if err := json.Unmarshal(raw, &row); err != nil {
		return p, fmt.Errorf("decode pg_publication row: %w", err)
	}
	p.Exists, p.AllTables, p.Insert = true, row.AllTables, row.Insert
	p.ViaRoot = row.ViaRoot != nil && *row.ViaRoot
	p.GenColsStored = row.GenCols == "s"
	rows, err := db.Query(ctx, `
		SELECT c.oid, pt.schemaname::text, pt.tablename::text, c.relkind::text
		FROM pg_publication_tables pt
		JOIN pg_namespace n ON n.nspname = pt.schemaname
		JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
		WHERE pt.pubname = $1
		ORDER BY 2, 3`, name)
	if err != nil {
		return p, fmt.Errorf("read the tables of publication %s: %w", name, err)
	}
	p.Tables, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Relation, error) {
		var rel Relation
		err := r.Scan(&rel.OID, &rel.Schema, &rel.Name, &rel.Kind)
		return rel, err
	})
	if err != nil {
		return p, fmt.Errorf("read the tables of publication %s: %w", name, err)
	}
	return p, nil
}

// CheckPublication says whether publication pub lets the relay stream
// table: it must exist, publish inserts, and publish that table, through
// its root when the table is partitioned. found is false when the
// configured table does not exist. Each error names the remedy.
//
// Another published relation that shares a partition or inheritance tree
// with the table (p.Kin: a partition, an ancestor, a sibling) is refused:
// its rows may be outbox rows under another name. Any other is foreign,
// provably not the outbox: it is returned, and the decoder skips its
// inserts (invariant 9, docs/architecture.md).
func CheckPublication(pub string, table Relation, found bool, p PublicationFacts) (foreign []Relation, err error) {
	q := pgx.Identifier{pub}.Sanitize()
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrPublication}, args...)...)
	}
	if !found {
		if p.Exists && !p.AllTables && len(p.Tables) == 1 {
			other := p.Tables[0]
			return nil, fail("table %s does not exist, but publication %s publishes %s (the same table renamed or moved?): set CDCRELAY_TABLE=%s, or rename it back",
				table.Qualified(), pub, other.Qualified(), other.Qualified())
		}
		return nil, fail("table %s does not exist: create it (cdcrelay migrate) or set CDCRELAY_TABLE to the outbox table", table.Qualified())
	}
	create := fmt.Sprintf("CREATE PUBLICATION … FOR TABLE %s WITH (publish = 'insert'%s) and set CDCRELAY_PUBLICATION to its name", table.Qualified(), viaRootOption(table.Kind))
	switch {
	case !p.Exists:
		return nil, fail("publication %s does not exist: run cdcrelay migrate as the owner of %s, or CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert'%s)",
			pub, table.Qualified(), q, table.Qualified(), viaRootOption(table.Kind))
	case p.AllTables:
		return nil, fail("publication %s is FOR ALL TABLES: the relay needs one that publishes only %s; %s", pub, table.Qualified(), create)
	case !p.Insert:
		return nil, fail("publication %s does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", pub, q)
	case table.Kind == "p" && !p.ViaRoot:
		return nil, fail("%s is partitioned and publication %s publishes its rows under each partition's name: ALTER PUBLICATION %s SET (publish_via_partition_root = true)",
			table.Qualified(), pub, q)
	}
	covers, kin, foreign := splitTables(table, p)
	if !covers {
		return nil, fail("publication %s does not publish %s: ALTER PUBLICATION %s SET TABLE %s", pub, table.Qualified(), q, table.Qualified())
	}
	if len(kin) > 0 {
		return nil, fail("publication %s also publishes %s, of the same partition or inheritance tree as %s: its rows may be outbox rows under another name, which the relay stops at rather than skip: ALTER PUBLICATION %s DROP TABLE the other relations, or %s",
			pub, listSome(kin, 5), table.Qualified(), q, create)
	}
	return foreign, nil
}

// splitTables sorts the publication's relations: the table itself
// (covers), its kin (p.Kin) by name, and the foreign ones.
func splitTables(table Relation, p PublicationFacts) (covers bool, kin []string, foreign []Relation) {
	for _, rel := range p.Tables {
		switch {
		case rel.OID == table.OID:
			covers = true
		case p.Kin[rel.OID]:
			kin = append(kin, rel.Qualified())
		default:
			foreign = append(foreign, rel)
		}
	}
	return covers, kin, foreign
}

// VerifyPublication checks at session start that the publication carries
// the configured table's inserts (CheckPublication) and, for each of
// mapped (the configured column names; empty ones are skipped), that
// pgoutput sends it at all (CheckGenerated). It returns the table, whose
// OID the decoder maps the outbox by, and the foreign relations the
// publication also publishes, whose inserts the decoder skips.
func VerifyPublication(ctx context.Context, db *pgx.Conn, t config.Outbox, mapped ...string) (Relation, []Relation, error) {
	table, found, err := ResolveTable(ctx, db, t)
	if err != nil {
		return table, nil, err
	}
	p, err := ReadPublication(ctx, db, t.Publication)
	if err != nil {
		return table, nil, err
	}
	if found {
		if p.Kin, err = Kin(ctx, db, table.OID, p.OIDs()); err != nil {
			return table, nil, err
		}
	}
	foreign, err := CheckPublication(t.Publication, table, found, p)
	if err != nil {
		return table, nil, err
	}
	gen, err := ReadGenerated(ctx, db, table, mapped)
	if err != nil {
		return table, nil, err
	}
	return table, foreign, CheckGenerated(t.Publication, table, p, gen)
}

// OIDs are the OIDs of the publication's relations.
func (p PublicationFacts) OIDs() []uint32 {
	oids := make([]uint32, 0, len(p.Tables))
	for _, rel := range p.Tables {
		oids = append(oids, rel.OID)
	}
	return oids
}

// Kin returns those of oids that share a partition or inheritance tree
// with the relation table (itself, a partition or child at any depth, an
// ancestor, a sibling): any relation whose ancestors (pg_inherits, which
// holds partitions too, followed to the top) meet the table's.
func Kin(ctx context.Context, db *pgx.Conn, table uint32, oids []uint32) (map[uint32]bool, error) {
	rows, err := db.Query(ctx, `
		WITH RECURSIVE up(rel, anc) AS (
			SELECT o, o FROM unnest($1::oid[]) o
			UNION
			SELECT up.rel, i.inhparent FROM up JOIN pg_inherits i ON i.inhrelid = up.anc)
		SELECT rel FROM up GROUP BY rel
		HAVING bool_or(anc IN (SELECT anc FROM up WHERE rel = $2::oid))`, append([]uint32{table}, oids...), table)
	if err != nil {
		return nil, fmt.Errorf("read the partition and inheritance trees of the publication: %w", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		return nil, fmt.Errorf("read the partition and inheritance trees of the publication: %w", err)
	}
	kin := make(map[uint32]bool, len(got))
	for _, oid := range got {
		kin[oid] = oid != table
	}
	return kin, nil
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
	kin, err := Kin(ctx, db, table.OID, oids)
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

// Generated is a generated column of the outbox table, as pg_attribute
// says: Kind is attgenerated ("s" stored, "v" virtual, PostgreSQL 18).
type Generated struct {
	Name, Kind string
}

// ReadGenerated returns those of columns that are generated columns of
// table, in the table's column order.
func ReadGenerated(ctx context.Context, db *pgx.Conn, table Relation, columns []string) ([]Generated, error) {
	rows, err := db.Query(ctx, `
		SELECT attname::text, attgenerated::text FROM pg_attribute
		WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attgenerated <> '' AND attname = ANY($2)
		ORDER BY attnum`, table.OID, columns)
	if err != nil {
		return nil, fmt.Errorf("read the generated columns of %s: %w", table.Qualified(), err)
	}
	gen, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Generated, error) {
		var g Generated
		err := r.Scan(&g.Name, &g.Kind)
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the generated columns of %s: %w", table.Qualified(), err)
	}
	return gen, nil
}

// CheckGenerated refuses a mapped column that pgoutput leaves out of the
// stream: a generated column, which PostgreSQL before 18 never publishes
// and 18 publishes only when stored and the publication says
// publish_generated_columns = stored. Refused at start, before any
// backlog is published: otherwise the snapshot backfill (which reads the
// table) publishes the backlog and the stream then stops at its first row
// for want of the column, or, for an optional column (headers, exchange,
// type), silently sends every event without it.
func CheckGenerated(pub string, table Relation, p PublicationFacts, gen []Generated) error {
	for _, g := range gen {
		if g.Kind == "s" && p.GenColsStored {
			continue
		}
		reason, remedy := GeneratedReason(pub, table, g)
		return fmt.Errorf("%w: %s; %s", ErrPublication, reason, remedy)
	}
	return nil
}

// GeneratedReason says why generated column g never reaches the relay
// through publication pub, and what to do. cdcrelay check says the same.
func GeneratedReason(pub string, table Relation, g Generated) (reason, remedy string) {
	col := pgx.Identifier{g.Name}.Sanitize()
	remedy = "make it a plain column filled by the application or a BEFORE INSERT trigger, or point the CDCRELAY_*_COLUMN setting at another column"
	if g.Kind == "v" {
		return fmt.Sprintf("column %s of %s is GENERATED ALWAYS AS (…) VIRTUAL: logical replication never publishes virtual generated columns, so every row would reach the relay without it",
			col, table.Qualified()), remedy
	}
	return fmt.Sprintf("column %s of %s is GENERATED ALWAYS AS (…) STORED: PostgreSQL before 18 does not publish generated columns (18 does only with publish_generated_columns = stored), so every row would reach the relay without it",
			col, table.Qualified()),
		remedy + fmt.Sprintf("; on PostgreSQL 18: ALTER PUBLICATION %s SET (publish_generated_columns = stored)", pgx.Identifier{pub}.Sanitize())
}

// createPublicationSQL is the statement that creates the publication for
// table: inserts only, and for a partitioned table through its root, so
// that every partition's rows arrive as the table's own.
func createPublicationSQL(pub string, table Relation) string {
	return fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert'%s)`,
		pgx.Identifier{pub}.Sanitize(), table.Qualified(), viaRootOption(table.Kind))
}

func viaRootOption(relkind string) string {
	if relkind == "p" {
		return ", publish_via_partition_root = true"
	}
	return ""
}

// PublicationNamesArg is pgoutput's publication_names option for one
// publication: a string literal holding the quoted name, since the server
// reads it as an identifier list (unquoted names would be folded).
func PublicationNamesArg(pub string) string {
	return "'" + strings.ReplaceAll(pgx.Identifier{pub}.Sanitize(), "'", "''") + "'"
}

func listSome(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}
