package slot

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// This file and rules_publication.go, rules_slot.go are the one rule book
// for the outbox table, its publication and the slot: pure functions from
// facts (read once, by ReadTable, ReadPublication, ReadColumns, ReadSlot)
// to problems. The relay refuses to stream on the first fatal problem
// (Refusal); cdcrelay check reports every problem, a fatal one as an ERROR
// and the others as WARN, with its remedy.

// Problem is one way the facts fall short of what the relay needs.
type Problem struct {
	// Fatal: the relay refuses to stream (check: ERROR); otherwise the
	// relay works and check warns.
	Fatal   bool
	Message string // what is wrong and what follows from it
	Remedy  string // what to do about it
	// Err is the sentinel the relay's error wraps: ErrPublication,
	// ErrSlotMismatch or ErrSlotLost.
	Err error
}

// refusal is the relay's error for the first fatal problem of lists, taken
// in order, or nil when none is fatal.
func refusal(lists ...[]Problem) error {
	for _, ps := range lists {
		for _, p := range ps {
			if p.Fatal {
				return fmt.Errorf("%w: %s: %s", p.Err, p.Message, p.Remedy)
			}
		}
	}
	return nil
}

// Scope is what the rules judge the facts against.
type Scope struct {
	config.Outbox
	// Quote shows an identifier in a message or remedy; nil quotes every
	// one (pgx.Identifier), as the relay's errors do. cdcrelay check quotes
	// only where SQL needs it, so that its remedies read as one types them.
	Quote func(string) string
	// RecreateLost is CDCRELAY_SLOT_LOST=recreate: an invalidated slot is
	// dropped and created again rather than refused.
	RecreateLost bool
}

func (s Scope) q(ident string) string {
	if s.Quote == nil {
		return pgx.Identifier{ident}.Sanitize()
	}
	return s.Quote(ident)
}

// rel is a relation's name as the messages show it.
func (s Scope) rel(schema, name string) string { return s.q(schema) + "." + s.q(name) }

// table is the configured outbox table's name.
func (s Scope) table() string { return s.rel(s.Schema, s.Table) }

// createPublicationSQL is the statement cdcrelay migrate (and the relay)
// would run: a partitioned table (relkind p) is published through its root.
func (s Scope) createPublicationSQL(relkind string) string {
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert'%s);", s.q(s.Publication), s.table(), viaRootOption(relkind))
}

// TableProblems judges the outbox table: it must exist and be a table.
// When it does not, and the publication publishes one table only, that is
// likely the outbox renamed or moved, and the remedy says so; check passes
// no publication facts (its publication finding names what it publishes).
func TableProblems(s Scope, tf TableFacts, p PublicationFacts) []Problem {
	switch tf.Kind {
	case "r", "p":
		return nil
	case "":
		// Whatever the role may do: a missing table is not a privilege
		// problem (pg_class lists every table to every role).
		pr := Problem{Fatal: true, Err: ErrPublication,
			Message: fmt.Sprintf("table %s does not exist in database %s", s.table(), tf.Database),
			Remedy:  "run `cdcrelay migrate` (as the schema owner) against this database, or point CDCRELAY_DATABASE_URL at the service's database, or set CDCRELAY_TABLE to the outbox table"}
		if p.Exists && !p.AllTables && len(p.Tables) == 1 {
			other := s.rel(p.Tables[0].Schema, p.Tables[0].Name)
			pr.Message += fmt.Sprintf(", but publication %s publishes %s (the same table renamed or moved?)", s.Publication, other)
			pr.Remedy = fmt.Sprintf("set CDCRELAY_TABLE=%s, or rename it back", other)
		}
		return []Problem{pr}
	}
	return []Problem{{Fatal: true, Err: ErrPublication,
		Message: fmt.Sprintf("%s is not a table (relkind %s): only a table's inserts are decoded", s.table(), tf.Kind),
		Remedy:  "set CDCRELAY_TABLE to the outbox table itself"}}
}

// GeneratedProblems refuses a mapped column that pgoutput leaves out of
// the stream: a generated column, which PostgreSQL before 18 never
// publishes and 18 publishes only when stored and the publication says
// publish_generated_columns = stored. Refused at start, before any
// backlog is published: otherwise the snapshot backfill (which reads the
// table) publishes the backlog and the stream then stops at its first row
// for want of the column, or, for an optional column (headers, exchange,
// type), silently sends every event without it.
func GeneratedProblems(s Scope, p PublicationFacts, cols Columns, m Mapped) []Problem {
	var ps []Problem
	for _, name := range m.all() {
		kind := cols[name]
		if name == "" || kind == "" || (kind == "s" && p.GenColsStored) {
			continue
		}
		reason, remedy := generatedReason(s, name, kind)
		ps = append(ps, Problem{Fatal: true, Err: ErrPublication, Message: reason + "; the relay refuses to start", Remedy: remedy})
	}
	return ps
}

// generatedReason says why the generated column name (attgenerated kind)
// never reaches the relay through the publication, and what to do. Unlike
// the other rules it quotes every name, whoever asks (check always did).
func generatedReason(s Scope, name, kind string) (reason, remedy string) {
	col, table := pgx.Identifier{name}.Sanitize(), pgx.Identifier{s.Schema, s.Table}.Sanitize()
	remedy = "make it a plain column filled by the application or a BEFORE INSERT trigger, or point the CDCRELAY_*_COLUMN setting at another column"
	if kind == "v" {
		return fmt.Sprintf("column %s of %s is GENERATED ALWAYS AS (…) VIRTUAL: logical replication never publishes virtual generated columns, so every row would reach the relay without it",
			col, table), remedy
	}
	return fmt.Sprintf("column %s of %s is GENERATED ALWAYS AS (…) STORED: PostgreSQL before 18 does not publish generated columns (18 does only with publish_generated_columns = stored), so every row would reach the relay without it",
			col, table),
		remedy + fmt.Sprintf("; on PostgreSQL 18: ALTER PUBLICATION %s SET (publish_generated_columns = stored)", pgx.Identifier{s.Publication}.Sanitize())
}

func viaRootOption(relkind string) string {
	if relkind == "p" {
		return ", publish_via_partition_root = true"
	}
	return ""
}
