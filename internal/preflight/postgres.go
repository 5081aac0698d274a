package preflight

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgerr"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// failed is the finding for a check that could not run.
func failed(check, what string, err error) Finding {
	return Finding{Check: check, Severity: Error,
		Message: fmt.Sprintf("could not %s: %v", what, err),
		Remedy:  "make sure the role can read the system catalogs (pg_settings, pg_roles, pg_class, pg_publication, pg_replication_slots) and retry"}
}

// databaseChecks runs every database check over one read-only session.
func databaseChecks(ctx context.Context, cfg config.Config, opts Options) []Finding {
	if cfg.DatabaseURL == "" {
		return []Finding{{Check: checkDatabase, Severity: Error, Message: "CDCRELAY_DATABASE_URL is not set",
			Remedy: "set CDCRELAY_DATABASE_URL (or CDCRELAY_DATABASE_URL_FILE) to the service database"}}
	}
	t, err := newTarget(cfg)
	if err != nil {
		return []Finding{{Check: checkTable, Severity: Error, Message: fmt.Sprintf("CDCRELAY_TABLE: %v", err), Remedy: "set CDCRELAY_TABLE to schema.table"}}
	}
	pc, err := pgx.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return []Finding{{Check: checkDatabase, Severity: Error, Message: "CDCRELAY_DATABASE_URL is not a valid PostgreSQL connection string",
			Remedy: "use postgres://user:password@host:5432/database or host=… dbname=… user=…"}}
	}
	pc.ConnectTimeout = opts.Timeout
	pc.RuntimeParams["application_name"] = checkApplicationName
	readOnly(&pc.Config)
	pc.RuntimeParams["statement_timeout"] = strconv.FormatInt(opts.Timeout.Milliseconds(), 10)
	where := config.Redact(cfg.DatabaseURL)
	// Connect and statement timeouts bound the usual cases; this bounds a
	// network that stalls mid-session. Checks cut short report the failure.
	ctx, cancel := context.WithTimeout(ctx, 4*opts.Timeout)
	defer cancel()
	db, err := pgx.ConnectConfig(ctx, pc)
	if err != nil {
		return []Finding{connectFailed(checkDatabase, where, err)}
	}
	defer func() { _ = db.Close(context.WithoutCancel(ctx)) }()

	var version string
	var inRecovery bool
	err = db.QueryRow(ctx, `SELECT current_database(), current_user, current_setting('server_version'), pg_is_in_recovery()`).
		Scan(&t.database, &t.role, &version, &inRecovery)
	if err != nil {
		return []Finding{failed(checkDatabase, "identify the server", err)}
	}
	fs := []Finding{{Check: checkDatabase, Message: fmt.Sprintf("connected to %s as %s (PostgreSQL %s, database %s)", where, t.role, version, t.database)}}
	if inRecovery {
		fs = append(fs, Finding{Check: checkDatabase, Severity: Error,
			Message: "the server is a standby (in recovery): the relay creates its slot and marks rows on the primary",
			Remedy:  "point CDCRELAY_DATABASE_URL at the primary"})
	}

	s := &session{db: db, t: t}
	// The slot's server: the primary, or the standby of
	// CDCRELAY_REPLICATION_URL, where the slot and its decoding are.
	ss := s
	if cfg.ReplicationURL != "" {
		sdb, bad := connectStandby(ctx, cfg, opts)
		if sdb == nil {
			return append(fs, bad...)
		}
		defer func() { _ = sdb.Close(context.WithoutCancel(ctx)) }()
		ss = &session{db: sdb, t: t}
		fs = append(fs, standbyChecks(ctx, config.Redact(cfg.ReplicationURL), s, ss)...)
	}
	fs = append(fs, s.settings(ctx)...)
	role, roleOK := s.role(ctx)
	tf, tableOK := s.table(ctx, &role)
	switch {
	case !roleOK.ok():
		fs = append(fs, roleOK)
	case tableOK.ok(): // else the table finding below says why grants are unknown
		fs = append(fs, classifyPrivileges(t, role)...)
	}
	if role.super || role.replication || role.rdsReplication {
		if s.sendersFree > 0 {
			fs = append(fs, replicationConnection(ctx, cfg, opts, t))
		}
	}
	if tableOK.ok() {
		fs = append(fs, classifyTable(t, tf))
		if tf.kind == "r" || tf.kind == "p" {
			fs = append(fs, classifyColumns(t, tf)...)
			fs = append(fs, classifyParkColumns(t, tf)...)
			fs = append(fs, s.retention(ctx, tf))
			if tf.kind == "r" {
				fs = append(fs, s.marks(ctx))
			}
		}
	} else {
		fs = append(fs, tableOK)
	}
	pub, err := s.publication(ctx, tf)
	if err != nil {
		fs = append(fs, failed(checkPublication, "read publication "+t.publication, err))
	} else {
		fs = append(fs, classifyPublication(t, tf, pub)...)
		fs = append(fs, classifyGenerated(t, tf, pub)...)
	}
	var sl slotFacts
	sl.Info, err = slot.ReadSlot(ctx, ss.db, t.slot)
	if err != nil {
		fs = append(fs, failed(checkSlot, "read replication slot "+t.slot, err))
	} else {
		sl.publicationMissing = !pub.Exists
		sl.noReplication = roleOK.ok() && !role.super && !role.replication && !role.rdsReplication
		fs = append(fs, classifySlot(t, sl))
	}
	if ff, err := ss.failover(ctx, cfg.SlotFailover); err != nil {
		fs = append(fs, failed(checkFailover, "read the server's failover settings", err))
	} else {
		fs = append(fs, classifyFailover(t, ff)...)
	}
	if of, err := origins(ctx, cfg.MarkOrigin, s, ss); err != nil {
		fs = append(fs, failed(checkOrigin, "read the replication origins and their grants", err))
	} else {
		fs = append(fs, classifyOrigin(t.role, of))
	}
	if others, err := s.otherSlots(ctx); err != nil {
		fs = append(fs, failed(checkOtherSlots, "list the other replication slots of database "+t.database, err))
	} else {
		fs = append(fs, classifyOtherSlots(t, relayApplicationName(cfg), others)...)
	}
	if prepared, long, err := s.transactions(ctx); err != nil {
		fs = append(fs, failed(checkTransactions, "read open transactions (pg_prepared_xacts, pg_stat_activity)", err))
	} else {
		fs = append(fs, classifyTransactions(prepared, long, sl.Exists)...)
	}
	fs = append(fs, slotLock(ctx, cfg, opts))
	return fs
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

// session holds the check connection and what earlier checks learnt.
type session struct {
	db                   *pgx.Conn
	t                    target
	slotExists           bool
	sendersFree          int
	canCreatePublication bool // owns the table and may CREATE in the database
}

func (s *session) settings(ctx context.Context) []Finding {
	rows, err := s.db.Query(ctx, `
		SELECT name, setting, pending_restart FROM pg_settings
		WHERE name IN ('wal_level', 'max_replication_slots', 'max_wal_senders', 'max_slot_wal_keep_size', 'synchronous_standby_names', 'server_encoding')`)
	if err != nil {
		return []Finding{failed(checkWALLevel, "read server settings", err)}
	}
	type setting struct {
		value   string
		pending bool
	}
	set := map[string]setting{}
	for rows.Next() {
		var name, value string
		var pending bool
		if err := rows.Scan(&name, &value, &pending); err != nil {
			rows.Close()
			return []Finding{failed(checkWALLevel, "read server settings", err)}
		}
		set[name] = setting{value, pending}
	}
	if err := rows.Err(); err != nil {
		return []Finding{failed(checkWALLevel, "read server settings", err)}
	}
	fs := []Finding{ClassifyWALLevel(set["wal_level"].value, set["wal_level"].pending), classifyEncoding(set["server_encoding"].value)}

	var slotsUsed, sendersUsed int
	err = s.db.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM pg_replication_slots), (SELECT count(*) FROM pg_stat_replication),
		       EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, s.t.slot).
		Scan(&slotsUsed, &sendersUsed, &s.slotExists)
	if err != nil {
		fs = append(fs, failed(checkSlots, "count replication slots and WAL senders", err))
	} else {
		need := 1
		if s.slotExists {
			need = 0
		}
		maxSlots, _ := strconv.Atoi(set["max_replication_slots"].value)
		maxSenders, _ := strconv.Atoi(set["max_wal_senders"].value)
		s.sendersFree = maxSenders - sendersUsed
		fs = append(fs,
			classifyHeadroom(checkSlots, maxSlots, slotsUsed, need, "slot"),
			classifyHeadroom(checkSenders, maxSenders, sendersUsed, 1, "replication connection"))
	}

	keep, supported := set["max_slot_wal_keep_size"]
	keepMB, _ := strconv.ParseInt(keep.value, 10, 64)
	fs = append(fs, classifyKeepSize(keepMB, supported), classifySyncStandby(set["synchronous_standby_names"].value))
	return fs
}

// role reads the role's attributes. A non-OK Finding means it could not.
func (s *session) role(ctx context.Context) (roleFacts, Finding) {
	var r roleFacts
	err := s.db.QueryRow(ctx, `
		SELECT rolsuper, rolreplication,
		       CASE WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication')
		            THEN pg_has_role(current_user, 'rds_replication', 'MEMBER') ELSE false END
		FROM pg_roles WHERE rolname = current_user`).Scan(&r.super, &r.replication, &r.rdsReplication)
	if err != nil {
		return r, failed(checkPrivileges, "read the attributes of role "+s.t.role, err)
	}
	return r, Finding{}
}

// table reads the outbox table, its columns and the role's grants on it
// (into r). A non-OK Finding means it could not.
func (s *session) table(ctx context.Context, r *roleFacts) (tableFacts, Finding) {
	var tf tableFacts
	var owns, createDB bool
	err := s.db.QueryRow(ctx, `
		SELECT c.oid, c.relkind::text, pg_get_userbyid(c.relowner),
		       pg_has_role(c.relowner, 'USAGE'), has_database_privilege(current_database(), 'CREATE'),
		       has_schema_privilege(n.oid, 'USAGE'),
		       has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'DELETE')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2`, s.t.schema, s.t.table).
		Scan(&tf.oid, &tf.kind, &tf.owner, &owns, &createDB, &r.schemaUsage, &r.selectPriv, &r.deletePriv)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return tf, Finding{}
	case err != nil:
		return tf, failed(checkTable, "look up table "+s.t.qualified(), err)
	}
	r.tableExists = true
	s.canCreatePublication = owns && createDB
	rows, err := s.db.Query(ctx, `
		SELECT a.attname, format_type(a.atttypid, a.atttypmod), coalesce(bt.typname, t.typname)::text, a.attnotnull,
		       has_column_privilege(a.attrelid, a.attnum, 'UPDATE'), a.attgenerated::text
		FROM pg_attribute a
		JOIN pg_type t ON t.oid = a.atttypid
		LEFT JOIN pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, tf.oid)
	if err != nil {
		return tf, failed(checkTable, "read the columns of "+s.t.qualified(), err)
	}
	for rows.Next() {
		var c column
		var update bool
		var generated string
		if err := rows.Scan(&c.name, &c.typ, &c.base, &c.notNull, &update, &generated); err != nil {
			rows.Close()
			return tf, failed(checkTable, "read the columns of "+s.t.qualified(), err)
		}
		switch c.name {
		case publishedAtColumn:
			r.hasPublishedAt, r.updatePublishedAt = true, update
		case "attempts", "last_error":
			if !update {
				r.cannotPark = append(r.cannotPark, c.name)
			}
		}
		tf.columns = append(tf.columns, c)
		if generated != "" {
			if tf.generated == nil {
				tf.generated = map[string]string{}
			}
			tf.generated[c.name] = generated
		}
	}
	if err := rows.Err(); err != nil {
		return tf, failed(checkTable, "read the columns of "+s.t.qualified(), err)
	}
	return tf, Finding{}
}

// replicationConnection opens a connection the way the relay's replication
// connection is opened (replication=database) and identifies the system:
// it proves the role, pg_hba.conf and max_wal_senders admit the relay.
func replicationConnection(ctx context.Context, cfg config.Config, opts Options, t target) Finding {
	f := Finding{Check: checkReplConn}
	url, name := cfg.DatabaseURL, "CDCRELAY_DATABASE_URL"
	if cfg.ReplicationURL != "" {
		url, name = cfg.ReplicationURL, "CDCRELAY_REPLICATION_URL" // the slot is on the standby
	}
	rc, err := pgconn.ParseConfig(url)
	if err != nil {
		f.Severity, f.Message = Error, name+" is not a valid PostgreSQL connection string"
		return f
	}
	rc.ConnectTimeout = opts.Timeout
	rc.RuntimeParams["replication"] = "database"
	rc.RuntimeParams["application_name"] = checkApplicationName
	conn, err := pgconn.ConnectConfig(ctx, rc)
	if err != nil {
		f = connectFailed(checkReplConn, "the database in replication mode", err)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == pgerr.InsufficientPrivilege {
			f.Remedy = fmt.Sprintf("ALTER ROLE %s REPLICATION;", quoteIdent(t.role))
		}
		return f
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return failed(checkReplConn, "run IDENTIFY_SYSTEM on a replication connection", err)
	}
	f.Message = fmt.Sprintf("replication connection as %s works (system %s, timeline %d, WAL at %s)", t.role, sys.SystemID, sys.Timeline, sys.XLogPos)
	return f
}
