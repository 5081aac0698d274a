package adoption

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgerr"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// The adoption marker (config.AdoptionMarkerName) is a physical slot that
// reserves no WAL and exists only while the backlog of a new slot is being
// published. A relay that finds it next to the slot knows the adoption did
// not finish: its own failed attempt, whose slot it keeps and whose
// backlog it goes on with, or a dead relay's, whose slot it creates again.
// Slot names are cluster-wide and config.CheckSlotName keeps the marker's
// name unique as the slot's is. It is the one piece of the relay's memory
// kept in the database (docs/architecture.md, "What the relay remembers").

// Begin takes the adoption lock and creates the marker. The relay calls
// it only while it holds the slot lock, which already excludes every
// other relay of this version; the adoption lock is kept so that a relay of
// an older version (which knows only this lock) never drops a slot being
// adopted during a rolling upgrade. It returns slot.ErrBusy when another
// process holds the adoption lock. The lock is session-scoped on db and
// ends with the connection, so a dead relay never leaves it behind.
func Begin(ctx context.Context, db *pgx.Conn, slotName string) error {
	var locked bool
	if err := db.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext('cdcrelay adoption ' || $1))`, slotName).Scan(&locked); err != nil {
		return fmt.Errorf("take adoption lock: %w", err)
	}
	if !locked {
		return fmt.Errorf("%w: another relay is publishing the backlog of slot %s", slot.ErrBusy, slotName)
	}
	_, err := db.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, false)`, config.AdoptionMarkerName(slotName))
	// A marker left by an adoption that did not finish stays, and marks
	// this one.
	var pgErr *pgconn.PgError
	if err != nil && (!errors.As(err, &pgErr) || pgErr.Code != pgerr.DuplicateObject) {
		return fmt.Errorf("create adoption marker %s: %w", config.AdoptionMarkerName(slotName), err)
	}
	return nil
}

// End drops the marker and releases the adoption lock: the slot's backlog
// is published and streaming may begin.
func End(ctx context.Context, db *pgx.Conn, slotName string) error {
	if err := slot.Drop(ctx, db, config.AdoptionMarkerName(slotName)); err != nil {
		return fmt.Errorf("drop adoption marker: %w", err)
	}
	if _, err := db.Exec(ctx, `SELECT pg_advisory_unlock(hashtext('cdcrelay adoption ' || $1))`, slotName); err != nil {
		return fmt.Errorf("release adoption lock: %w", err)
	}
	return nil
}
