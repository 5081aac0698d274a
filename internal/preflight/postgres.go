package preflight

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/config"
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
	pc, err := pgx.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, []Finding{{Check: checkDatabase, Severity: Error, Message: "CDCRELAY_DATABASE_URL is not a valid PostgreSQL connection string",
			Remedy: "use postgres://user:password@host:5432/database or host=… dbname=… user=…"}}
	}
	pc.ConnectTimeout = opts.Timeout
	pc.RuntimeParams["application_name"] = checkApplicationName
	readOnly(&pc.Config)
	pc.RuntimeParams["statement_timeout"] = strconv.FormatInt(opts.Timeout.Milliseconds(), 10)
	where := config.Redact(cfg.DatabaseURL)
	db, err := pgx.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, []Finding{connectFailed(checkDatabase, where, err)}
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

// readOnly makes the session read-only once connected, so that the
// preflight cannot write. It is set after the connection is validated, not
// as a startup parameter: with target_session_attrs=read-write (or
// primary) pgconn asks the server whether the session is read-only and
// would reject every server of a session started read-only, so check would
// fail where run, which connects without it, succeeds.
func readOnly(pc *pgconn.Config) {
	next := pc.AfterConnect
	pc.AfterConnect = func(ctx context.Context, conn *pgconn.PgConn) error {
		if next != nil {
			if err := next(ctx, conn); err != nil {
				return err
			}
		}
		if _, err := conn.Exec(ctx, "SET default_transaction_read_only = on").ReadAll(); err != nil {
			return fmt.Errorf("make the check's session read-only: %w", err)
		}
		return nil
	}
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

// connectFailed turns a connection error into a finding whose remedy fits
// the cause. where is the redacted URL.
func connectFailed(check, where string, err error) Finding {
	f := Finding{Check: check, Severity: Error, Message: fmt.Sprintf("cannot connect to %s: %v", where, pgerr.Connect(err))}
	var pgErr *pgconn.PgError
	code := ""
	if errors.As(err, &pgErr) {
		code = pgErr.Code
	}
	switch code {
	case pgerr.InvalidPassword:
		f.Remedy = "check the user and password in CDCRELAY_DATABASE_URL"
	case pgerr.InvalidAuthorizationSpec:
		f.Remedy = "allow this user, database and address in pg_hba.conf, then SELECT pg_reload_conf();"
	case pgerr.InvalidCatalogName:
		f.Remedy = "check the database name in CDCRELAY_DATABASE_URL"
	case pgerr.InsufficientPrivilege:
		f.Remedy = "grant the role LOGIN and CONNECT on the database"
	case pgerr.TooManyConnections:
		f.Remedy = "the server is out of connection slots: raise max_connections or lower other clients' pools"
	case "":
		f.Remedy = "check that PostgreSQL runs and is reachable at the host and port in CDCRELAY_DATABASE_URL (firewall, DNS, sslmode)"
	default:
		f.Remedy = "see the server log for SQLSTATE " + code
	}
	return f
}
