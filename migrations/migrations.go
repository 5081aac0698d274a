// Package migrations embeds the outbox schema as plain SQL files, so
// services can copy them into their own migration tools, and applies them.
package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"

	"github.com/jackc/pgx/v5"
)

//go:embed *.sql
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
// idempotent, so running it again changes nothing.
func ApplyTo(ctx context.Context, db *pgx.Conn, t Target) error {
	for _, name := range Names() {
		sql, err := Render(name, t)
		if err != nil {
			return err
		}
		err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(lockKey)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sql)
			return err
		})
		if err != nil {
			return fmt.Errorf("apply %s: %w", name, err)
		}
	}
	return nil
}
