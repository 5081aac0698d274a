package pgconnect

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
	"github.com/cdcrelay/cdcrelay/internal/pgerr"
)

// This file tags a connection's transactions with a replication origin
// (PostgreSQL 16+), so that a relay whose stream asks pgoutput for origin
// 'none' never decodes them: the janitor's marking UPDATEs and retention's
// DELETEs are skipped before the walsender's reorder buffer instead of
// being queued, spilled and thrown away (docs/operations.md, "Marks the
// walsender does not decode").

// OriginPrefix starts the name of every replication origin a relay sets
// up. A relay filters its stream by origin only when every origin in the
// cluster has this prefix: a transaction with any other origin (a
// subscription's apply worker, say) might insert outbox rows.
const OriginPrefix = "cdcrelay_"

// originGrantsSQL says whether the role may create and use origins (they
// are superuser-only until granted).
const originGrantsSQL = `SELECT has_function_privilege('pg_replication_origin_oid(text)', 'EXECUTE')
	AND has_function_privilege('pg_replication_origin_create(text)', 'EXECUTE')
	AND has_function_privilege('pg_replication_origin_session_setup(text)', 'EXECUTE')`

// ErrOriginBusy means another session uses the origin now: a previous
// janitor or retention pass that has not ended yet. Retried.
var ErrOriginBusy = errors.New("replication origin in use by another session")

// SetupOrigin tags db's transactions with the replication origin name,
// creating it if needed. It reports false, without an error, where the
// server is older than 16 or the role lacks the grants: the work is the
// same, only decoded. It probes db's server (pgcaps.Probe) first; a caller
// that has probed already calls SetupProbedOrigin.
func SetupOrigin(ctx context.Context, db *pgx.Conn, name string) (bool, error) {
	caps, err := pgcaps.Probe(ctx, db)
	if err != nil {
		return false, err
	}
	return SetupProbedOrigin(ctx, db, caps, name)
}

// SetupProbedOrigin is SetupOrigin on a server already probed: caps is
// db's.
func SetupProbedOrigin(ctx context.Context, db *pgx.Conn, caps pgcaps.Caps, name string) (bool, error) {
	if usable, err := OriginsUsable(ctx, db, caps); err != nil || !usable {
		return false, err
	}
	var exists bool
	if err := db.QueryRow(ctx, `SELECT pg_replication_origin_oid($1) IS NOT NULL`, name).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up replication origin %s: %w", name, err)
	}
	if !exists {
		if _, err := db.Exec(ctx, `SELECT pg_replication_origin_create($1)`, name); err != nil && !isCode(err, pgerr.UniqueViolation) && !isCode(err, pgerr.DuplicateObject) {
			return false, fmt.Errorf("create replication origin %s: %w", name, err)
		}
	}
	if _, err := db.Exec(ctx, `SELECT pg_replication_origin_session_setup($1)`, name); err != nil {
		if isCode(err, pgerr.ObjectInUse) {
			return false, fmt.Errorf("%w: %s: %w", ErrOriginBusy, name, err)
		}
		return false, fmt.Errorf("set up replication origin %s: %w", name, err)
	}
	return true, nil
}

// OnlyRelayOrigins reports whether every replication origin of the
// cluster is a relay's (OriginPrefix): only then may a stream skip
// transactions that carry an origin. It reads what ForeignOrigins reads,
// the shared-memory state too where db's role may.
func OnlyRelayOrigins(ctx context.Context, db *pgx.Conn) (bool, []string, error) {
	status, err := ReadsOriginStatus(ctx, db)
	if err != nil {
		return false, nil, err
	}
	others, err := ForeignOrigins(ctx, db, status)
	if err != nil {
		return false, nil, err
	}
	return len(others) == 0, others, nil
}

// ReadsOriginStatus reports whether db's role may read the replication
// origins' shared-memory state (pg_show_replication_origin_status, which
// is superuser-only until granted).
func ReadsOriginStatus(ctx context.Context, db *pgx.Conn) (bool, error) {
	var ok bool
	if err := db.QueryRow(ctx, `SELECT has_function_privilege('pg_show_replication_origin_status()', 'EXECUTE')`).Scan(&ok); err != nil {
		return false, fmt.Errorf("read the grant on pg_show_replication_origin_status: %w", err)
	}
	return ok, nil
}

// foreignOriginsSQL lists the origins of the catalog that are not a
// relay's. The catalog is read under a snapshot: an origin created by a
// transaction whose commit is written but not yet visible (it waits for a
// synchronous standby) is not there.
const foreignOriginsSQL = `SELECT coalesce(array_agg(roname ORDER BY roname), '{}')
	FROM pg_replication_origin WHERE left(roname, length($1)) <> $1`

// foreignOriginsStatusSQL adds the shared-memory state, which is no
// snapshot: a session that set an origin up, before its first change
// under it, has a slot there, named from the catalog when its row is
// visible and NULL when not (created in the same transaction, not yet
// visible; or by a transaction that aborted, which leaves the slot until
// its id is used again). An unnamed slot cannot be shown to be a relay's:
// it counts as foreign.
const foreignOriginsStatusSQL = `SELECT coalesce(array_agg(DISTINCT name ORDER BY name), '{}') FROM (
	SELECT roname FROM pg_replication_origin
	UNION ALL
	SELECT coalesce(external_id, format('origin id %s (not visible in pg_replication_origin)', local_id))
	FROM pg_show_replication_origin_status()) AS o(name)
	WHERE left(name, length($1)) <> $1`

// ForeignOrigins lists the replication origins of the cluster that are
// not a relay's: those of the catalog and, with status (ReadsOriginStatus),
// those of the shared-memory state, which also holds an origin whose
// creation is not visible yet. One round trip.
func ForeignOrigins(ctx context.Context, db *pgx.Conn, status bool) ([]string, error) {
	sql := foreignOriginsSQL
	if status {
		sql = foreignOriginsStatusSQL
	}
	var others []string
	if err := db.QueryRow(ctx, sql, OriginPrefix).Scan(&others); err != nil {
		return nil, fmt.Errorf("list replication origins: %w", err)
	}
	return others, nil
}

// OriginsUsable reports whether db's server and role can tag
// transactions with a replication origin (pgcaps.Caps.OriginNone, caps
// being db's server, and the grants of SetupOrigin): only then do the
// relay's marks carry one, and only then is there anything for a stream to
// skip by origin. Before 16 it asks nothing.
func OriginsUsable(ctx context.Context, db *pgx.Conn, caps pgcaps.Caps) (bool, error) {
	if !caps.OriginNone() {
		return false, nil
	}
	var granted bool
	if err := db.QueryRow(ctx, originGrantsSQL).Scan(&granted); err != nil {
		return false, fmt.Errorf("read the replication origin grants: %w", err)
	}
	return granted, nil
}

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
