package pgconnect

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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

// originVersion is the first server_version_num whose pgoutput filters by
// origin.
const originVersion = 160000

// originGrantsSQL says whether the role may create and use origins (they
// are superuser-only until granted).
const originGrantsSQL = `SELECT current_setting('server_version_num')::int,
	has_function_privilege('pg_replication_origin_oid(text)', 'EXECUTE')
	AND has_function_privilege('pg_replication_origin_create(text)', 'EXECUTE')
	AND has_function_privilege('pg_replication_origin_session_setup(text)', 'EXECUTE')`

// ErrOriginBusy means another session uses the origin now: a previous
// janitor or retention pass that has not ended yet. Retried.
var ErrOriginBusy = errors.New("replication origin in use by another session")

// SetupOrigin tags db's transactions with the replication origin name,
// creating it if needed. It reports false, without an error, where the
// server is older than 16 or the role lacks the grants: the work is the
// same, only decoded.
func SetupOrigin(ctx context.Context, db *pgx.Conn, name string) (bool, error) {
	var version int
	var granted bool
	if err := db.QueryRow(ctx, originGrantsSQL).Scan(&version, &granted); err != nil {
		return false, fmt.Errorf("read the replication origin grants: %w", err)
	}
	if version < originVersion || !granted {
		return false, nil
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
// transactions that carry an origin.
func OnlyRelayOrigins(ctx context.Context, db *pgx.Conn) (bool, []string, error) {
	var others []string
	err := db.QueryRow(ctx, `SELECT coalesce(array_agg(roname ORDER BY roname), '{}') FROM pg_replication_origin WHERE left(roname, length($1)) <> $1`, OriginPrefix).Scan(&others)
	if err != nil {
		return false, nil, fmt.Errorf("list replication origins: %w", err)
	}
	return len(others) == 0, others, nil
}

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
