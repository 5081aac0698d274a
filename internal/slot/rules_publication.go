package slot

import (
	"fmt"
	"slices"
	"strings"
)

// Mapped are the configured columns of the outbox: the id, routing key and
// payload the relay needs, and the optional ones ("" when not configured).
type Mapped struct {
	Required, Optional []string
}

func (m Mapped) all() []string { return append(slices.Clone(m.Required), m.Optional...) }

// PublicationProblems judges the publication: it must exist and publish
// the outbox table's inserts, only them, through its root when the table
// is partitioned, with every mapped column; nothing else that may be
// outbox rows under another name (FOR ALL TABLES, a relation of the
// outbox's partition or inheritance tree). Any other relation it
// publishes is foreign: the relay skips its inserts (invariant 9,
// docs/architecture.md), and check warns of the cost.
func PublicationProblems(s Scope, tf TableFacts, p PublicationFacts, cols Columns, m Mapped) []Problem {
	if !p.Exists {
		return []Problem{missingPublication(s, tf, p)}
	}
	pub := s.q(s.Publication)
	var ps []Problem
	bad := func(fatal bool, msg, remedy string) {
		ps = append(ps, Problem{Fatal: fatal, Err: ErrPublication, Message: msg, Remedy: remedy})
	}
	setInsert := fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert');", pub)
	if !p.Insert {
		bad(true, fmt.Sprintf("publication %s does not publish inserts: the relay would receive no events", s.Publication), setInsert)
	}
	if extra := p.otherOps(); len(extra) > 0 {
		// The relay streams such a publication (it skips what is not an
		// insert), so this is a warning: it costs, it does not break.
		bad(false, fmt.Sprintf("publication %s also publishes %s: the relay works, but the walsender decodes every such change (the relay's own published_at updates and retention deletes among them) and sends it to the relay, which discards it: WAL decoding, network traffic and row data outside the insert-only scope the outbox needs",
			s.Publication, strings.Join(extra, ", ")), setInsert+" (publish inserts only)")
	}
	covers, kin, foreign := split(tf, p)
	others := len(kin) + len(foreign)
	switch {
	case p.AllTables && others == 0:
		// The relay refuses FOR ALL TABLES even while the outbox is the
		// only table: the next table created would join it.
		bad(true, fmt.Sprintf("publication %s is FOR ALL TABLES: the relay refuses it (any table created later would be published too); it needs a publication of %s alone", s.Publication, s.table()),
			fmt.Sprintf("give the relay a publication of its own: %s (and set CDCRELAY_PUBLICATION)", s.createPublicationSQL(tf.Kind)))
	case !covers && p.AllTables:
		bad(true, fmt.Sprintf("publication %s is FOR ALL TABLES but does not list %s", s.Publication, s.table()),
			"check CDCRELAY_TABLE and that the table is an ordinary, non-temporary table")
	case !covers && tf.Kind == "":
		// No publication can cover a table that is not there: the likely
		// slip is CDCRELAY_TABLE (TableProblems says it is missing).
		remedy := fmt.Sprintf("set CDCRELAY_TABLE to the outbox table; or create %s (`cdcrelay migrate`), then add it: ALTER PUBLICATION %s ADD TABLE %s;", s.table(), pub, s.table())
		if others > 0 {
			remedy = fmt.Sprintf("set CDCRELAY_TABLE to the table publication %s publishes (%s), or create %s with `cdcrelay migrate`", s.Publication, strings.Join(s.names(p.Tables), ", "), s.table())
		}
		bad(true, fmt.Sprintf("publication %s cannot cover %s, which does not exist", s.Publication, s.table()), remedy)
	case !covers:
		bad(true, fmt.Sprintf("publication %s does not cover %s: the relay would receive no events", s.Publication, s.table()),
			fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s;", pub, s.table()))
	}
	if !covers {
		return ps
	}
	if tf.Kind == "p" && !p.ViaRoot {
		bad(true, fmt.Sprintf("%s is partitioned and publication %s publishes its rows under each partition's name, which the relay does not map", s.table(), s.Publication),
			fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true);", pub))
	}
	if p.RowFilter != "" {
		bad(false, fmt.Sprintf("publication %s publishes only the rows of %s matching WHERE %s: other rows are never relayed", s.Publication, s.table(), p.RowFilter),
			fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s; (no row filter)", pub, s.table()))
	}
	if p.Columns != nil {
		ps = append(ps, columnListProblems(s, p, cols, m)...)
	}
	return append(ps, othersProblems(s, tf, p, kin, foreign)...)
}

// otherOps are the operations besides insert that p publishes.
func (p PublicationFacts) otherOps() []string {
	var extra []string
	for _, op := range []struct {
		on   bool
		name string
	}{{p.Update, "update"}, {p.Delete, "delete"}, {p.Truncate, "truncate"}} {
		if op.on {
			extra = append(extra, op.name)
		}
	}
	return extra
}

// split sorts the publication's relations: whether it covers the table
// (the table itself, or its partitions, published under their own names
// without publish_via_partition_root), its kin (p.Kin: a partition,
// ancestor or sibling published beside it), by name, and the foreign ones.
func split(tf TableFacts, p PublicationFacts) (covers bool, kin, foreign []Relation) {
	for _, rel := range p.Tables {
		switch {
		case p.outbox(tf, rel):
			covers = true
		case p.Kin[rel.OID]:
			kin = append(kin, rel)
		default:
			foreign = append(foreign, rel)
		}
	}
	return covers, kin, foreign
}

func (s Scope) names(rels []Relation) []string {
	names := make([]string, 0, len(rels))
	for _, rel := range rels {
		names = append(names, s.rel(rel.Schema, rel.Name))
	}
	return names
}

// missingPublication is the problem of a publication that does not exist:
// who could create it, if anyone. The relay creates it at start when it
// may (EnsurePublication), so to the relay, whose facts leave CanCreate
// false, a missing one is fatal.
func missingPublication(s Scope, tf TableFacts, p PublicationFacts) Problem {
	pr := Problem{Fatal: true, Err: ErrPublication,
		Message: fmt.Sprintf("publication %s does not exist", s.Publication),
		Remedy:  fmt.Sprintf("run `cdcrelay migrate` as the owner of %s, or: %s", s.table(), s.createPublicationSQL(tf.Kind))}
	switch {
	case tf.Kind == "":
		// TableProblems says why; no role could create a publication of
		// a table that is not there.
		pr.Message += fmt.Sprintf(", nor does table %s it must publish", s.table())
		pr.Remedy = "run `cdcrelay migrate` (as the schema owner) against this database: it creates both"
	case p.CanCreate:
		// The relay creates it at start, as this role may: it works, so
		// this is a warning, not an error.
		pr.Fatal = false
		pr.Message += fmt.Sprintf(" (the relay would create it at start only because role %s owns the table; create it with the schema so the relay can run as a least-privilege role)", tf.Role)
	default:
		pr.Message += fmt.Sprintf("; role %s cannot create it (it needs to own %s and have CREATE on the database), so the relay cannot start", tf.Role, s.table())
	}
	return pr
}

// othersProblems judges the other relations a publication covering the
// outbox also publishes: FOR ALL TABLES, or one of the outbox's tree
// (whose rows may be outbox rows under another name), is refused; any
// other is foreign, and the relay skips its inserts (invariant 9).
func othersProblems(s Scope, tf TableFacts, p PublicationFacts, kin, foreign []Relation) []Problem {
	pub := s.q(s.Publication)
	own := fmt.Sprintf("give the relay a publication of its own: %s (and set CDCRELAY_PUBLICATION), or ALTER PUBLICATION %s SET TABLE %s;", s.createPublicationSQL(tf.Kind), pub, s.table())
	if p.AllTables && len(kin)+len(foreign) > 0 {
		return []Problem{{Fatal: true, Err: ErrPublication, Remedy: own,
			Message: fmt.Sprintf("publication %s also covers every table (FOR ALL TABLES): %s: the relay refuses to stream it, since any table created later would be published too", s.Publication, listSome(s.names(p.others(tf)), 5))}}
	}
	if len(kin) > 0 {
		return []Problem{{Fatal: true, Err: ErrPublication, Remedy: own,
			Message: fmt.Sprintf("publication %s also covers %s, of the partition or inheritance tree of %s: the relay refuses to stream it, since such a row may be an outbox row under another name, and it stops there rather than skip it", s.Publication, listSome(s.names(kin), 5), s.table())}}
	}
	if len(foreign) == 0 {
		return nil
	}
	names := s.names(foreign)
	return []Problem{{Err: ErrPublication,
		Message: fmt.Sprintf("publication %s also covers %s, which is not the outbox: the relay skips its inserts (a warning per table and session, cdcrelay_foreign_inserts_skipped_total), but the walsender decodes and sends every one of them", s.Publication, listSome(names, 5)),
		Remedy:  fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE %s; (unless another consumer needs it: then give the relay a publication of its own)", pub, strings.Join(names, ", "))}}
}

// outbox says whether rel, published by p, is the outbox as the relay
// maps it: the table itself, or one of its partitions published under its
// own name (without publish_via_partition_root: the partition rule says
// so). With it, a partition listed beside its root is kin.
func (p PublicationFacts) outbox(tf TableFacts, rel Relation) bool {
	return (tf.Kind != "" && rel.OID == tf.OID) || (p.Parts[rel.OID] && !p.ViaRoot)
}

// others are the relations p publishes besides the outbox, in name order.
func (p PublicationFacts) others(tf TableFacts) []Relation {
	var rels []Relation
	for _, rel := range p.Tables {
		if !p.outbox(tf, rel) {
			rels = append(rels, rel)
		}
	}
	return rels
}

// columnListProblems judges a publication's column list: the relay needs
// the id, routing key and payload, and can use the optional columns.
// Mapped columns the table lacks are the mapping's problem, not the list's.
func columnListProblems(s Scope, p PublicationFacts, cols Columns, m Mapped) []Problem {
	leftOut := func(names []string) []string {
		var out []string
		for _, c := range names {
			if _, inTable := cols[c]; c != "" && inTable && !slices.Contains(p.Columns, c) {
				out = append(out, c)
			}
		}
		return out
	}
	all := fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s; (all columns)", s.q(s.Publication), s.table())
	var ps []Problem
	if dropped := leftOut(m.Required); len(dropped) > 0 {
		ps = append(ps, Problem{Fatal: true, Err: ErrPublication, Remedy: all,
			Message: fmt.Sprintf("publication %s's column list leaves out %s: the relay stops at the first row", s.Publication, strings.Join(dropped, ", "))})
	}
	if dropped := leftOut(m.Optional); len(dropped) > 0 {
		ps = append(ps, Problem{Err: ErrPublication, Remedy: all,
			Message: fmt.Sprintf("publication %s's column list leaves out %s: the relay cannot use them", s.Publication, strings.Join(dropped, ", "))})
	}
	return ps
}

func listSome(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}
