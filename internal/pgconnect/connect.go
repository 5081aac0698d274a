package pgconnect

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/pgerr"
)

// Timeout bounds each attempt to connect (TCP connect, TLS, authentication:
// one host of a multi-host URL) unless the URL sets connect_timeout, and,
// separately, the set-up that follows (LockHolder's, Setup). Per attempt,
// as libpq's connect_timeout, so that a multi-host URL
// (target_session_attrs=read-write) still reaches its second host when the
// first one hangs.
const Timeout = 10 * time.Second

// Options say how a role's connection is set up.
type Options struct {
	// Database, when set, replaces the URL's database: the slot lock's
	// connection goes to CDCRELAY_LOCK_DATABASE on the same server.
	Database string
	// Params are set unless the URL sets them; Force is set whatever the
	// URL says (retention's own application_name and statement timeout).
	Params, Force map[string]string
	// LockHolder marks a connection that holds or waits for a session
	// advisory lock (the slot lock, the monitor lock): it gets keepalives
	// and no statement or lock timeout from the start (keepalives), and
	// its session is set up to stay for days (hold).
	LockHolder bool
	// Durable marks a connection whose commits the slot relies on once
	// they return (the janitor's marks and parks): they are flushed to the
	// server's WAL first whatever synchronous_commit the server, database,
	// role or URL says (durable, durable.go).
	Durable bool
	// Setup, when set, runs after connecting (and after the lock holder's
	// and Durable's set-up), within Timeout; the connection is closed if
	// it fails.
	Setup func(ctx context.Context, db *pgx.Conn) error
	// Timeout, when positive, replaces the package's Timeout for this
	// connection: it bounds each attempt whatever the URL's
	// connect_timeout says, and the set-up. 0 keeps the default rule
	// (the URL's connect_timeout, else Timeout). cdcrelay check's -timeout
	// sets it, so that the operator's bound holds for every connection
	// the check opens.
	Timeout time.Duration
}

// attemptTimeout applies o's timeout rule to cfg's per-attempt
// ConnectTimeout (Options.Timeout).
func attemptTimeout(cfg *pgconn.Config, o Options) {
	switch {
	case o.Timeout > 0:
		cfg.ConnectTimeout = o.Timeout
	case cfg.ConnectTimeout == 0:
		cfg.ConnectTimeout = Timeout
	}
}

// Connect opens a connection to url for role, which names the connection
// in the error ("connect <role>: …", e.g. role "to database"), with the
// relay's application_name, client encoding and o's set-up. A connection
// error goes through pgerr.Connect, so its causes come first; the chain
// keeps the *pgconn.PgError and the *pgconn.ConnectError.
func Connect(ctx context.Context, url, role string, o Options) (*pgx.Conn, error) {
	params := o.Params
	if o.LockHolder {
		params = merge(keepalives(), o.Params)
	}
	cfg, err := Config(url, params)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", role, err)
	}
	if o.Database != "" {
		cfg.Database = o.Database
	}
	for k, v := range o.Force {
		cfg.RuntimeParams[k] = v
	}
	attemptTimeout(&cfg.Config, o)
	db, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", role, pgerr.Connect(err))
	}
	if err := setUp(ctx, db, o); err != nil {
		Close(ctx, db)
		return nil, fmt.Errorf("connect %s: %w", role, err)
	}
	return db, nil
}

// setUp runs the lock holder's set-up, Durable's and o.Setup within
// Timeout (or o.Timeout).
func setUp(ctx context.Context, db *pgx.Conn, o Options) error {
	if !o.LockHolder && !o.Durable && o.Setup == nil {
		return nil
	}
	limit := Timeout
	if o.Timeout > 0 {
		limit = o.Timeout
	}
	sctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	if o.LockHolder {
		if err := hold(sctx, db); err != nil {
			return err
		}
	}
	if o.Durable {
		if err := durable(sctx, db); err != nil {
			return err
		}
	}
	if o.Setup != nil {
		return o.Setup(sctx, db)
	}
	return nil
}

// ConnectReplication opens a replication connection (replication=database)
// to url for role, as Connect does. Of o, Params, Force and Timeout apply
// as they do for Connect; Database, LockHolder, Durable and Setup set up a
// *pgx.Conn session and are refused here rather than ignored.
func ConnectReplication(ctx context.Context, url, role string, o Options) (*pgconn.PgConn, error) {
	if o.Database != "" || o.LockHolder || o.Durable || o.Setup != nil {
		return nil, fmt.Errorf("connect %s: a replication connection takes no Database, LockHolder, Durable or Setup", role)
	}
	cfg, err := ReplicationConfig(url, o.Params)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", role, err)
	}
	for k, v := range o.Force {
		cfg.RuntimeParams[k] = v
	}
	cfg.RuntimeParams["replication"] = "database"
	attemptTimeout(cfg, o)
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", role, pgerr.Connect(err))
	}
	return conn, nil
}

// merge returns the parameters of a and b, b's winning.
func merge(a, b map[string]string) map[string]string {
	for k, v := range b {
		a[k] = v
	}
	return a
}
