package slot

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// SlotHolder is the process whose walsender holds a replication slot
// (pg_replication_slots.active_pid), as pg_stat_activity names it.
type SlotHolder struct {
	PID int
	// ApplicationName is readable by every role; ClientAddr only by the
	// same role, a superuser or pg_read_all_stats ("" when hidden).
	ApplicationName, ClientAddr string
}

// ReadHolder reads who holds the slot now; ok is false when the slot does
// not exist or no process holds it.
func ReadHolder(ctx context.Context, db *pgx.Conn, slotName string) (h SlotHolder, ok bool, err error) {
	var app, addr *string
	err = db.QueryRow(ctx, `
		SELECT s.active_pid, a.application_name, coalesce(host(a.client_addr), CASE WHEN a.pid IS NOT NULL AND a.backend_start IS NOT NULL THEN 'local' END)
		FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
		WHERE s.slot_name = $1 AND s.active_pid IS NOT NULL`, slotName).Scan(&h.PID, &app, &addr)
	if errors.Is(err, pgx.ErrNoRows) {
		return h, false, nil
	}
	if err != nil {
		return h, false, fmt.Errorf("look up the holder of replication slot %s: %w", slotName, err)
	}
	h.ApplicationName, h.ClientAddr = deref(app), deref(addr)
	return h, true, nil
}
