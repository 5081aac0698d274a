package preflight

import (
	"fmt"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// This file holds the findings the relay reports too, when the server
// refuses it for the same reason: one wording and one remedy, whoever
// finds the problem first (ClassifyWALLevel is in classify.go).

// lacks is the finding for a privilege the role lacks.
func lacks(role, priv, why, remedy string) Finding {
	return Finding{Check: checkPrivileges, Severity: Error,
		Message: fmt.Sprintf("role %s lacks %s: %s", role, priv, why), Remedy: remedy}
}

// NoReplication is the finding for a role without the REPLICATION
// attribute: check reports it, and the relay when the server refuses its
// replication connection.
func NoReplication(role string) Finding {
	r := quoteIdent(role)
	return lacks(role, "REPLICATION", "it cannot create the slot or open the replication connection",
		fmt.Sprintf("ALTER ROLE %s REPLICATION; (as a superuser; on RDS/Aurora: GRANT rds_replication TO %s;)", r, r))
}

// NoSelect is the finding for a role that may not read the outbox: check
// reports it, and the relay before it creates a slot, whose backlog it
// reads from the slot's snapshot.
func NoSelect(schema, table, role string) Finding {
	t := target{schema: schema, table: table}
	return lacks(role, "SELECT on "+t.qualified(), "it reads unpublished rows when it creates its slot",
		fmt.Sprintf("GRANT SELECT ON %s TO %s;", t.qualified(), quoteIdent(role)))
}

// MissingColumns judges the outbox's columns, by name, with check's own
// mapping rules and returns their errors: a required mapped column (id,
// routing key, payload) or published_at that the table lacks. The relay
// asks before it creates a slot, since a table it cannot mark or map
// fails only once the slot exists (its backlog query, or its first mark)
// and a slot left behind keeps WAL for good. Types are not judged here:
// check warns of them, and the relay sends a column's text form.
func MissingColumns(o config.Outbox, columns []string) []Finding {
	t := target{schema: o.Schema, table: o.Table, id: o.IDColumn, key: o.RoutingKeyColumn, payload: o.PayloadColumn,
		headers: o.HeadersColumn, exch: o.ExchangeColumn, msgType: o.TypeColumn}
	tf := tableFacts{kind: "r"}
	for _, c := range columns {
		tf.columns = append(tf.columns, column{name: c, notNull: true})
	}
	var fs []Finding
	for _, f := range classifyColumns(t, tf) {
		// Without types, only a missing column can be an error.
		if f.Severity == Error {
			fs = append(fs, f)
		}
	}
	return fs
}
