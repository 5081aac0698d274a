package preflight

import "fmt"

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
