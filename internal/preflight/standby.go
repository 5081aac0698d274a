package preflight

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
)

// standbyFacts is what the standby check reads on both servers.
type standbyFacts struct {
	server             pgcaps.Caps
	systemID           string
	primarySystemID    string
	walLevel, feedback string
	primarySlot        string // primary_slot_name on the standby
	physicalActive     bool   // that slot exists on the primary and a standby streams from it
	physicalExists     bool
	canSnapshot        bool // the role may call pg_log_standby_snapshot() on the primary
	snapshotExists     bool // the primary has pg_log_standby_snapshot() (16+, with DecodesOnStandby)
}

// connectStandby opens a read-only session on CDCRELAY_REPLICATION_URL.
// A finding says why it could not.
func connectStandby(ctx context.Context, cfg config.Config, opts Options) (*pgx.Conn, []Finding) {
	where := config.Redact(cfg.ReplicationURL)
	sdb, err := pgconnect.Connect(ctx, cfg.ReplicationURL, "to the replication server", checkSession(opts, statementTimeout(opts)))
	if errors.Is(err, pgconnect.ErrParse) {
		return nil, []Finding{{Check: checkStandby, Severity: Error, Message: "CDCRELAY_REPLICATION_URL is not a valid PostgreSQL connection string",
			Remedy: "use postgres://user:password@standby:5432/database"}}
	}
	if err != nil {
		return nil, []Finding{connectFailedTo(checkStandby, where, "CDCRELAY_REPLICATION_URL", err)}
	}
	return sdb, nil
}

// standbyChecks judges the standby (session ss) as the server that holds
// the slot for the primary (session s).
func standbyChecks(ctx context.Context, where string, s, ss *session) []Finding {
	var f standbyFacts
	var err error
	if f.server, err = ss.probe(ctx); err != nil {
		return []Finding{failed(checkStandby, "read the replication server's settings", err)}
	}
	err = ss.db.QueryRow(ctx, `SELECT system_identifier::text,
		       current_setting('wal_level'), current_setting('hot_standby_feedback'), current_setting('primary_slot_name')
		FROM pg_control_system()`).Scan(&f.systemID, &f.walLevel, &f.feedback, &f.primarySlot)
	if err != nil {
		return []Finding{failed(checkStandby, "read the replication server's settings", err)}
	}
	err = s.db.QueryRow(ctx, `SELECT (SELECT system_identifier::text FROM pg_control_system()),
		       EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND slot_type = 'physical'),
		       coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $1 AND slot_type = 'physical'), false),
		       to_regprocedure('pg_log_standby_snapshot()') IS NOT NULL,
		       coalesce(has_function_privilege(to_regprocedure('pg_log_standby_snapshot()'), 'EXECUTE'), false)`, f.primarySlot).
		Scan(&f.primarySystemID, &f.physicalExists, &f.physicalActive, &f.snapshotExists, &f.canSnapshot)
	if err != nil {
		return []Finding{failed(checkStandby, "read the primary's side of the standby", err)}
	}
	return classifyStandby(where, s.t.role, f)
}

// classifyStandby judges the standby that is to hold the slot.
func classifyStandby(where, role string, f standbyFacts) []Finding {
	bad := func(msg, remedy string) []Finding {
		return []Finding{{Check: checkStandby, Severity: Error, Message: msg, Remedy: remedy}}
	}
	switch {
	case f.systemID != f.primarySystemID:
		return bad(fmt.Sprintf("%s is database system %s, the primary %s: the replication server must be a physical standby of CDCRELAY_DATABASE_URL's primary", where, f.systemID, f.primarySystemID),
			"point CDCRELAY_REPLICATION_URL at a standby of the primary, or unset it")
	case !f.server.InRecovery:
		return []Finding{{Check: checkStandby, Severity: Warn,
			Message: fmt.Sprintf("%s is not a standby (%s): the slot and its decoding stay on a primary", where, f.server),
			Remedy:  "point CDCRELAY_REPLICATION_URL at a physical standby, or unset it (after a promotion this is expected until a new standby exists)"}}
	case !f.server.DecodesOnStandby():
		return bad(fmt.Sprintf("%s is %s: logical decoding on a standby needs PostgreSQL 16 or later", where, f.server), "upgrade, or unset CDCRELAY_REPLICATION_URL")
	case f.walLevel != "logical":
		return bad(fmt.Sprintf("the standby %s has wal_level=%s", where, f.walLevel), "set wal_level = logical on the standby (as on the primary) and restart it")
	case f.feedback != "on":
		return bad(fmt.Sprintf("the standby %s has hot_standby_feedback=%s: the primary would vacuum catalog rows the slot needs, and PostgreSQL invalidates the slot (the relay refuses to start)", where, f.feedback),
			"ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf(); on the standby")
	}
	fs := []Finding{{Check: checkStandby, Message: fmt.Sprintf("%s is a standby of the primary (%s, wal_level=logical, hot_standby_feedback=on): the slot and its decoding are there, marks and retention on the primary", where, f.server)}}
	switch {
	case f.primarySlot == "":
		fs = append(fs, Finding{Check: checkStandby, Severity: Warn,
			Message: "the standby has no primary_slot_name: without a physical slot, hot_standby_feedback does not survive a standby restart and the primary may remove WAL the standby still needs",
			Remedy:  "SELECT pg_create_physical_replication_slot('<name>'); on the primary, then primary_slot_name = '<name>' on the standby"})
	case !f.physicalExists || !f.physicalActive:
		fs = append(fs, Finding{Check: checkStandby, Severity: Warn,
			Message: fmt.Sprintf("the primary's physical slot %s (the standby's primary_slot_name) is %s: the standby does not stream from the primary now", f.primarySlot, map[bool]string{true: "inactive", false: "missing"}[f.physicalExists]),
			Remedy:  "check the standby's primary_conninfo and log"})
	}
	if f.snapshotExists && !f.canSnapshot {
		fs = append(fs, Finding{Check: checkStandby, Severity: Warn,
			Message: fmt.Sprintf("role %s may not call pg_log_standby_snapshot() on the primary: creating the slot on the standby then waits for the primary to log a running-xacts record by itself, which an idle primary may not do (the relay gives up after 2 minutes and retries)", role),
			Remedy:  fmt.Sprintf("GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO %s; (as a superuser, in the primary's database)", quoteIdent(role))})
	}
	return fs
}

// standbyCheck judges the standby of CDCRELAY_REPLICATION_URL, when the
// slot is there.
func standbyCheck(ctx context.Context, s *session) []Finding {
	if s.ss == s {
		return nil
	}
	return standbyChecks(ctx, config.Redact(s.cfg.ReplicationURL), s, s.ss)
}
