package pgconnect

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
)

// MonitorLockClass is the first key of the monitor lock, "cdcm" in ASCII;
// the second is hashtext(slot name), as for the slot lock (slot.LockClass,
// "cdcr"). Every replica's monitor takes it with pg_try_advisory_lock on
// its own lock holder's connection to the outbox database (not
// CDCRELAY_LOCK_DATABASE), and the holder alone refreshes the backlog and
// slot gauges, whatever its role. In pg_locks: classid = MonitorLockClass,
// objid = hashtext(slot), objsubid = 2, in the outbox database.
const MonitorLockClass int32 = 0x6364636d

// keepalives are the connection parameters of a connection that holds a
// session advisory lock (the slot lock, the monitor lock): the server
// notices within about 25 s a holder whose host vanished without closing
// its socket, instead of the operating system's two hours, so the lock
// does not stay with it. No statement or lock timeout applies from the
// start either: a role's statement_timeout of a millisecond could
// otherwise cancel hold's own SET on a busy server, before it takes
// effect (parameters of the connection request override the role's and
// the database's defaults). Options.LockHolder sets them.
func keepalives() map[string]string {
	return map[string]string{
		"tcp_keepalives_idle":     "10",
		"tcp_keepalives_interval": "5",
		"tcp_keepalives_count":    "3",
		"statement_timeout":       "0",
		"lock_timeout":            "0",
	}
}

// hold makes db's session fit for holding (or waiting for) a session lock
// for days whatever the role's or database's defaults: no statement or
// lock timeout ends a wait or a statement the caller bounds with its own
// context, and no idle_session_timeout ends an idle holder's session (and
// its lock). client_connection_check_interval makes a backend blocked in
// pg_advisory_lock look at its socket now and then, so a waiter that dies
// leaves the lock queue within seconds; it sends nothing. The last two
// exist from PostgreSQL 14 (pgcaps.Caps.SessionTimeouts), told from the
// version the server reported at connection start.
func hold(ctx context.Context, db *pgx.Conn) error {
	set := "SET statement_timeout = 0; SET lock_timeout = 0"
	if pgcaps.FromServerVersion(db.PgConn().ParameterStatus("server_version")).SessionTimeouts() {
		set += "; SET idle_session_timeout = 0; SET client_connection_check_interval = '5s'"
	}
	if _, err := db.Exec(ctx, set); err != nil {
		return fmt.Errorf("set up the session: %w", err)
	}
	return nil
}
