package preflight

import (
	"fmt"
	"slices"
	"strings"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// This file classifies the outbox table and its columns; like classify.go
// it does no I/O.

// column is one table column: its declared type and its base type's name
// (domains resolved), e.g. "character varying(200)" and "varchar".
type column struct {
	name, typ, base string
	notNull         bool
}

// tableFacts describe the outbox table; kind is pg_class.relkind, "" when
// there is no such relation.
type tableFacts struct {
	oid     uint32
	kind    string
	owner   string
	columns []column
	// generated maps each generated column to its pg_attribute.attgenerated:
	// "s" stored, "v" virtual (PostgreSQL 18).
	generated map[string]string
}

func (tf tableFacts) column(name string) (column, bool) {
	for _, c := range tf.columns {
		if c.name == name {
			return c, true
		}
	}
	return column{}, false
}

// facts are the table's facts as the rule book (internal/slot) takes them.
func (tf tableFacts) facts(t target) slot.TableFacts {
	return slot.TableFacts{Relation: slot.Relation{OID: tf.oid, Schema: t.schema, Name: t.table, Kind: tf.kind}, Database: t.database, Role: t.role}
}

// mappedColumns are the table's columns, each with its attgenerated.
func (tf tableFacts) mappedColumns() slot.Columns {
	cols := slot.Columns{}
	for _, c := range tf.columns {
		cols[c.name] = tf.generated[c.name]
	}
	return cols
}

// classifyTable reports the table's problem (slot.TableProblems, which the
// relay refuses to stream on too), or that it exists. It passes no
// publication facts: the publication's finding names what that publishes.
func classifyTable(t target, tf tableFacts) Finding {
	if ps := slot.TableProblems(t.scope(), tf.facts(t), slot.PublicationFacts{}); len(ps) > 0 {
		return findings(checkTable, ps)[0]
	}
	f := Finding{Check: checkTable, Message: fmt.Sprintf("%s exists (owner %s)", t.qualified(), tf.owner)}
	if tf.kind == "p" {
		f.Message = fmt.Sprintf("%s exists, partitioned (owner %s)", t.qualified(), tf.owner)
	}
	return f
}

// A columnRule says which base types suit a mapped column.
type columnRule struct {
	role     string // what the relay does with it
	variable string // the CDCRELAY_ variable naming it
	good     []string
	bad      map[string]string // base type -> why it is an error
	required bool
}

var (
	ruleID = columnRule{role: "message_id", variable: "CDCRELAY_ID_COLUMN", required: true,
		good: []string{"uuid", "text", "varchar", "int8", "int4"}}
	ruleKey = columnRule{role: "routing key", variable: "CDCRELAY_ROUTING_KEY_COLUMN", required: true,
		good: []string{"text", "varchar"}}
	rulePayload = columnRule{role: "message body", variable: "CDCRELAY_PAYLOAD_COLUMN", required: true,
		good: []string{"jsonb", "json", "text", "varchar"},
		bad:  map[string]string{"bytea": "the body would be PostgreSQL's hex text (\\x…), not the bytes"}}
	ruleHeaders = columnRule{role: "AMQP headers", variable: "CDCRELAY_HEADERS_COLUMN", good: []string{"jsonb", "json"}}
	ruleExch    = columnRule{role: "per-row exchange", variable: "CDCRELAY_EXCHANGE_COLUMN", good: []string{"text", "varchar"}}
	ruleType    = columnRule{role: "AMQP type", variable: "CDCRELAY_TYPE_COLUMN", good: []string{"text", "varchar"}}
)

// classifyColumns checks the table against the column mapping. It is only
// called for an existing table.
func classifyColumns(t target, tf tableFacts) []Finding {
	var fs []Finding
	for _, m := range []struct {
		name string
		rule columnRule
	}{{t.id, ruleID}, {t.key, ruleKey}, {t.payload, rulePayload}} {
		fs = append(fs, classifyColumn(t, tf, m.name, m.rule))
	}
	var absent []string
	for _, m := range []struct {
		name string
		rule columnRule
	}{{t.headers, ruleHeaders}, {t.exch, ruleExch}, {t.msgType, ruleType}} {
		if m.name == "" {
			continue
		}
		if _, ok := tf.column(m.name); !ok {
			absent = append(absent, m.name)
			continue
		}
		fs = append(fs, classifyColumn(t, tf, m.name, m.rule))
	}
	switch c, ok := tf.column(publishedAtColumn); {
	case !ok:
		fs = append(fs, Finding{Check: checkMapping, Severity: Error,
			Message: fmt.Sprintf("%s has no %s column: the relay marks acknowledged rows in it", t.qualified(), publishedAtColumn),
			Remedy:  fmt.Sprintf("ALTER TABLE %s ADD COLUMN published_at timestamptz; (the schema in migrations/0001_event_outbox.sql has it)", t.qualified())})
	case c.base != "timestamptz" && c.base != "timestamp":
		fs = append(fs, Finding{Check: checkMapping, Severity: Warn,
			Message: fmt.Sprintf("%s is %s; the relay sets it to now()", publishedAtColumn, c.typ),
			Remedy:  fmt.Sprintf("ALTER TABLE %s ALTER COLUMN published_at TYPE timestamptz;", t.qualified())})
	default:
		fs = append(fs, Finding{Check: checkMapping, Message: fmt.Sprintf("%s: %s (set when the broker acked the row)", publishedAtColumn, c.typ)})
	}
	if len(absent) > 0 {
		fs = append(fs, Finding{Check: checkMapping, Message: "optional columns not in the table (their features are off): " + strings.Join(absent, ", ")})
	}
	return fs
}

func classifyColumn(t target, tf tableFacts, name string, r columnRule) Finding {
	f := Finding{Check: checkMapping}
	c, ok := tf.column(name)
	if !ok {
		f.Severity = Error
		f.Message = fmt.Sprintf("%s column %q (%s) is not in %s", r.role, name, r.variable, t.qualified())
		f.Remedy = fmt.Sprintf("set %s to the column holding the %s, or add the column (see migrations/0001_event_outbox.sql)", r.variable, r.role)
		return f
	}
	f.Message = fmt.Sprintf("%s: %s → %s", name, c.typ, r.role)
	if why, bad := r.bad[c.base]; bad {
		f.Severity = Error
		f.Message = fmt.Sprintf("%s: %s: %s", name, c.typ, why)
		f.Remedy = fmt.Sprintf("use a %s column (%s)", r.role, strings.Join(r.good, ", "))
		return f
	}
	if !slices.Contains(r.good, c.base) {
		f.Severity = Warn
		f.Message = fmt.Sprintf("%s: %s is an unusual type for the %s; the relay sends its text form", name, c.typ, r.role)
		f.Remedy = fmt.Sprintf("use one of %s, or point %s at another column", strings.Join(r.good, ", "), r.variable)
		return f
	}
	if r.required && !c.notNull {
		f.Severity = Warn
		f.Message = fmt.Sprintf("%s: %s allows NULL: %s", name, c.typ, nullFate(t, r))
		f.Remedy = fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s SET NOT NULL;", t.qualified(), quoteIdent(name))
	}
	return f
}

// classifyGenerated refuses a mapped column that is generated, which
// pgoutput leaves out of every row (slot.GeneratedProblems: the relay
// refuses it at start too).
func classifyGenerated(t target, tf tableFacts, p slot.PublicationFacts) []Finding {
	return findings(checkMapping, slot.GeneratedProblems(t.scope(), p, tf.mappedColumns(), t.mapped()))
}

// nullFate says what the decoder (internal/wal) does with a row whose
// required column r is NULL: without an id the row cannot be parked (its
// mark names it by id), so the relay stops; a NULL routing key or payload
// makes the row poison, which CDCRELAY_POISON parks or stops at.
func nullFate(t target, r columnRule) string {
	if r.role == ruleID.role {
		return fmt.Sprintf("a row with a NULL %s stops the relay at that row (it cannot be parked without an id)", r.role)
	}
	if t.poison == config.PoisonStop {
		return fmt.Sprintf("a row with a NULL %s is poison and, with CDCRELAY_POISON=stop, stops the relay at that row", r.role)
	}
	return fmt.Sprintf("a row with a NULL %s is poison: it is parked (attempts, last_error set; published_at stays NULL) and the stream goes on", r.role)
}
