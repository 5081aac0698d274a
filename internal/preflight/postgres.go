package preflight

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/pgerr"
)

// failed is the finding for a check that could not run.
func failed(check, what string, err error) Finding {
	return Finding{Check: check, Severity: Error,
		Message: fmt.Sprintf("could not %s: %v", what, err),
		Remedy:  "make sure the role can read the system catalogs (pg_settings, pg_roles, pg_class, pg_publication, pg_replication_slots) and retry"}
}

// database opens a read-only session (and one on the slot's server, when
// that is a standby) and runs every database check (dbChecks) over it.
func database(ctx context.Context, cfg config.Config, opts Options) []Finding {
	if cfg.DatabaseURL == "" {
		return []Finding{{Check: checkDatabase, Severity: Error, Message: "CDCRELAY_DATABASE_URL is not set",
			Remedy: "set CDCRELAY_DATABASE_URL (or CDCRELAY_DATABASE_URL_FILE) to the service database"}}
	}
	t, err := newTarget(cfg)
	if err != nil {
		return []Finding{{Check: checkTable, Severity: Error, Message: fmt.Sprintf("CDCRELAY_TABLE: %v", err), Remedy: "set CDCRELAY_TABLE to schema.table"}}
	}
	// Connect and statement timeouts bound the usual cases; this bounds a
	// network that stalls mid-session. Checks cut short report the failure.
	ctx, cancel := context.WithTimeout(ctx, 4*opts.Timeout)
	defer cancel()
	db, fs := connectPrimary(ctx, cfg, opts, &t)
	if db == nil {
		return fs
	}
	defer func() { _ = db.Close(context.WithoutCancel(ctx)) }()
	s := &session{db: db, t: t, cfg: cfg, opts: opts, loaded: map[fact]bool{}}
	s.ss = s
	if cfg.ReplicationURL != "" {
		sdb, bad := connectStandby(ctx, cfg, opts)
		if sdb == nil {
			return append(fs, bad...)
		}
		defer func() { _ = sdb.Close(context.WithoutCancel(ctx)) }()
		s.ss = &session{db: sdb, t: t, cfg: cfg, opts: opts} // runs no checks: they read it through s
	}
	return append(fs, s.runChecks(ctx)...)
}

// connectPrimary opens the read-only session on CDCRELAY_DATABASE_URL and
// identifies the server and the role (into t). The findings say whom it
// reached, or why it could not (then the connection is nil).
func connectPrimary(ctx context.Context, cfg config.Config, opts Options, t *target) (*pgx.Conn, []Finding) {
	where := config.Redact(cfg.DatabaseURL)
	db, err := pgconnect.Connect(ctx, cfg.DatabaseURL, "to database", checkSession(opts, statementTimeout(opts)))
	if errors.Is(err, pgconnect.ErrParse) {
		return nil, []Finding{{Check: checkDatabase, Severity: Error, Message: "CDCRELAY_DATABASE_URL is not a valid PostgreSQL connection string",
			Remedy: "use postgres://user:password@host:5432/database or host=… dbname=… user=…"}}
	}
	if err != nil {
		// The broker's checks still run (Run); the database's need this
		// connection, and saying so keeps "1 error, … ok" from reading as
		// a clean database.
		f := connectFailed(checkDatabase, where, err)
		f.Message += " (the other database checks need this connection and did not run)"
		return nil, []Finding{f}
	}
	var version string
	var inRecovery bool
	err = db.QueryRow(ctx, `SELECT current_database(), current_user, current_setting('server_version'), pg_is_in_recovery()`).
		Scan(&t.database, &t.role, &version, &inRecovery)
	if err != nil {
		_ = db.Close(context.WithoutCancel(ctx))
		return nil, []Finding{failed(checkDatabase, "identify the server", err)}
	}
	fs := []Finding{{Check: checkDatabase, Message: fmt.Sprintf("connected to %s as %s (PostgreSQL %s, database %s)", where, t.role, version, t.database)}}
	if inRecovery {
		fs = append(fs, Finding{Check: checkDatabase, Severity: Error,
			Message: "the server is a standby (in recovery): the relay creates its slot and marks rows on the primary",
			Remedy:  "point CDCRELAY_DATABASE_URL at the primary"})
	}
	return db, fs
}

// checkSession is pgconnect's options for one of check's sessions, opened
// as the relay opens its own but named checkApplicationName whatever the
// URL says (so that it is never taken for the relay), with each attempt
// and the set-up bounded by opts.Timeout (-timeout, over the URL's
// connect_timeout), read-only once connected (readOnly), and force's
// parameters set whatever the URL says.
func checkSession(opts Options, force map[string]string) pgconnect.Options {
	f := map[string]string{"application_name": checkApplicationName}
	for k, v := range force {
		f[k] = v
	}
	return pgconnect.Options{Force: f, Timeout: opts.Timeout, Setup: readOnly}
}

// statementTimeout bounds each of a session's statements by opts.Timeout.
func statementTimeout(opts Options) map[string]string {
	return map[string]string{"statement_timeout": strconv.FormatInt(opts.Timeout.Milliseconds(), 10)}
}

// readOnly makes the session read-only once connected (pgconnect's
// Setup), so that the preflight cannot write. It is set after the
// connection is validated, not as a startup parameter: with
// target_session_attrs=read-write (or primary) pgconn asks the server
// whether the session is read-only and would reject every server of a
// session started read-only, so check would fail where run, which connects
// without it, succeeds.
func readOnly(ctx context.Context, db *pgx.Conn) error {
	if _, err := db.Exec(ctx, "SET default_transaction_read_only = on"); err != nil {
		return fmt.Errorf("make the check's session read-only: %w", err)
	}
	return nil
}

// ok reports whether a Finding returned alongside facts means they are
// usable (the zero Finding does).
func (f Finding) ok() bool { return f.Severity != Error }

func newTarget(cfg config.Config) (target, error) {
	schema, table, err := config.SplitTable(cfg.Table)
	if err != nil {
		return target{}, err
	}
	return target{
		schema: schema, table: table, publication: cfg.Publication, slot: cfg.Slot,
		id: cfg.IDColumn, key: cfg.RoutingKeyColumn, payload: cfg.PayloadColumn,
		headers: cfg.HeadersColumn, exch: cfg.ExchangeColumn, msgType: cfg.TypeColumn,
		slotLost: cfg.SlotLost, poison: cfg.Poison,
	}, nil
}

// connectFailed turns pgconnect's connection error to CDCRELAY_DATABASE_URL
// into a finding (connectFailedTo).
func connectFailed(check, where string, err error) Finding {
	return connectFailedTo(check, where, "CDCRELAY_DATABASE_URL", err)
}

// connectFailedTo turns pgconnect's connection error into a finding whose
// remedy fits the cause (pgerr.Diagnose, which the relay's wait as
// needs_operator uses too) and names setting, the variable of the URL.
// where is the redacted URL: it names the server, so the message drops
// pgconnect's "connect <role>: " and gives the error under it, which has
// been through pgerr.Connect already (applying that twice would repeat its
// remedy).
func connectFailedTo(check, where, setting string, err error) Finding {
	cause := err
	if inner := errors.Unwrap(err); inner != nil {
		cause = inner
	}
	return Finding{Check: check, Severity: Error, Message: fmt.Sprintf("cannot connect to %s: %v", where, cause),
		Remedy: pgerr.Diagnose(err, setting).Remedy}
}
