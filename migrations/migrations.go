// Package migrations embeds the outbox schema as plain SQL files, so
// services can copy them into their own migration tools, and applies them.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgerr"
)

//go:embed *.sql optional/*.sql
var files embed.FS

// lockKey serialises concurrent migrate runs (several replicas starting at
// once) with a transaction-scoped advisory lock.
const lockKey = 0x63646372656c6179 // "cdcrelay"

// Names lists the migration files in the order they apply.
func Names() []string {
	names, _ := fs.Glob(files, "*.sql")
	sort.Strings(names)
	return names
}

// Apply runs every migration in order for the default names
// (public.event_outbox, publication cdcrelay_outbox).
func Apply(ctx context.Context, db *pgx.Conn) error {
	return ApplyTo(ctx, db, Default)
}

// ApplyTo runs every migration in order, each in its own transaction, with
// the files' default names replaced by t's (Render). Each file is
// idempotent, so running it again changes nothing. A file whose first line
// is noTransaction (a concurrent index build, which must not block the
// services' inserts into a live outbox) runs outside a transaction.
func ApplyTo(ctx context.Context, db *pgx.Conn, t config.Outbox) error {
	for _, name := range Names() {
		sql, err := Render(name, t)
		if err != nil {
			return err
		}
		skip, err := skipped(ctx, db, t, sql)
		if err != nil {
			return fmt.Errorf("apply %s: %w", name, err)
		}
		if skip {
			continue
		}
		if strings.HasPrefix(sql, noTransaction) {
			err = applyOutsideTransaction(ctx, db, t, sql)
		} else {
			err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(lockKey)); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, sql)
				return err
			})
		}
		if err != nil {
			return fmt.Errorf("apply %s: %w", name, ownerHint(err))
		}
	}
	return nil
}

// ownerHint adds to a permission error (SQLSTATE 42501) who may run the
// migrations: the usual mistake is running them as the relay's own
// least-privilege role, which may neither create nor alter the table.
func ownerHint(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerr.InsufficientPrivilege {
		return fmt.Errorf("%w: run migrate as the outbox table's owner (or a role that may create it)", err)
	}
	return err
}

// noTransaction starts a file that must run outside a transaction block.
const noTransaction = "-- cdcrelay:no-transaction\n"

// applyOutsideTransaction runs sql (one statement) under the session-level
// form of the migration lock. A concurrent index build that failed earlier
// left an invalid index that IF NOT EXISTS would keep for ever: invalid
// indexes of the table are dropped first (concurrently too), so the build
// is tried again. Only the outbox's own invalid indexes are touched, and an
// index is invalid only while, or after, a concurrent build failed.
func applyOutsideTransaction(ctx context.Context, db *pgx.Conn, t config.Outbox, sql string) (err error) {
	if _, err := db.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(lockKey)); err != nil {
		return err
	}
	defer func() {
		if _, uerr := db.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, int64(lockKey)); err == nil && uerr != nil {
			err = uerr
		}
	}()
	rows, err := db.Query(ctx, `SELECT format('%I.%I', n.nspname, c.relname)
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE i.indrelid = to_regclass($1) AND NOT i.indisvalid`, pgx.Identifier{t.Schema, t.Table}.Sanitize())
	if err != nil {
		return fmt.Errorf("look for invalid indexes: %w", err)
	}
	invalid, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("look for invalid indexes: %w", err)
	}
	for _, index := range invalid {
		if _, err := db.Exec(ctx, `DROP INDEX CONCURRENTLY IF EXISTS `+index); err != nil {
			return fmt.Errorf("drop invalid index %s: %w", index, err)
		}
	}
	var partitioned bool
	if err := db.QueryRow(ctx, `SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)`,
		pgx.Identifier{t.Schema, t.Table}.Sanitize()).Scan(&partitioned); err != nil {
		return fmt.Errorf("look up the table: %w", err)
	}
	if partitioned {
		// PostgreSQL cannot build an index on a partitioned table
		// concurrently; the plain build blocks inserts while it runs
		// (docs/operations.md says how to build it partition by partition).
		sql = strings.Replace(sql, "CREATE INDEX CONCURRENTLY", "CREATE INDEX", 1)
	}
	_, err = db.Exec(ctx, sql)
	return err
}
