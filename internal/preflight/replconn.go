package preflight

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/pgerr"
)

// replicationConnectionCheck opens a replication connection when the role
// may and a WAL sender is free (else the privileges and headroom findings
// say why not).
func replicationConnectionCheck(ctx context.Context, s *session) []Finding {
	if (s.role.super || s.role.replication || s.role.rdsReplication) && s.sendersFree() > 0 {
		return []Finding{replicationConnection(ctx, s.cfg, s.opts, s.t)}
	}
	return nil
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
	o := checkSession(opts, nil)
	o.Setup = nil // ConnectReplication takes none; check runs only IDENTIFY_SYSTEM here
	conn, err := pgconnect.ConnectReplication(ctx, url, "for replication", o)
	if errors.Is(err, pgconnect.ErrParse) {
		f.Severity, f.Message = Error, name+" is not a valid PostgreSQL connection string"
		return f
	}
	if err != nil {
		f = connectFailedTo(checkReplConn, "the database in replication mode", name, err)
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
