package inbox

import (
	"context"
	_ "embed" // the ledger's schema, as plain SQL
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Schema is the ledger's SQL (tables cdcrelay_inbox and
// cdcrelay_inbox_order with their indexes), for services that apply their
// migrations with their own tool. Every statement is idempotent. It lives
// here rather than in the repository's migrations directory because it
// belongs in the consumer's database, which `cdcrelay migrate` never
// touches. The tables are created in the first schema of the search_path.
//
//go:embed schema.sql
var Schema string

// migrateLockKey serialises concurrent Migrate calls (several consumers
// starting at once): CREATE TABLE IF NOT EXISTS is not safe against a
// concurrent create of the same table.
const migrateLockKey = 0x696e626f78 // "inbox"

// Migrate applies Schema in one transaction under an advisory lock.
func Migrate(ctx context.Context, db DB) error {
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLockKey)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, Schema)
		return err
	})
	if err != nil {
		return fmt.Errorf("inbox: apply the ledger schema: %w", err)
	}
	return nil
}
