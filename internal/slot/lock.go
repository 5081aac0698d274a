package slot

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// LockClass is the first key of every slot lock, "cdcr" in ASCII; the
// second is hashtext(slot name). Two-key advisory locks live apart from
// single bigint keys, so an application's own advisory locks never clash
// with the relay's. In pg_locks a slot lock is locktype 'advisory' with
// classid = LockClass, objid = hashtext(slot) as an unsigned number and
// objsubid = 2.
const LockClass int32 = 0x63646372

// The slot lock is a session advisory lock held, for as long as a relay
// owns the slot, on its normal connection to the slot's database: every
// lifecycle action (dropping a lost slot or an interrupted adoption's,
// creating the slot, the snapshot backfill) and the streaming itself
// happen only under it, so no two relays of this version ever act on a
// slot at once. It ends with the connection, so a dead relay never leaves
// it behind.

// TryLock takes the slot lock if it is free.
func TryLock(ctx context.Context, db *pgx.Conn, slotName string) (bool, error) {
	var ok bool
	if err := db.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, hashtext($2))`, LockClass, slotName).Scan(&ok); err != nil {
		return false, fmt.Errorf("take the slot lock: %w", err)
	}
	return ok, nil
}

// WaitLock blocks in one statement until the slot lock is this session's:
// the server wakes it when the holder's session ends. Nothing is sent
// while it waits. It returns with ctx's error when ctx ends first.
func WaitLock(ctx context.Context, db *pgx.Conn, slotName string) error {
	if _, err := db.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, LockClass, slotName); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("wait for the slot lock: %w", err)
	}
	return nil
}

// Holder describes the session that holds the slot lock.
type Holder struct {
	PID             int32
	ApplicationName string
	ClientAddr      string
	Since           time.Time // the holder's backend_start (zero when hidden)
}

// LockHolder reads who holds the slot lock from pg_locks (visible to every
// role) and pg_stat_activity (details hidden from roles without
// pg_read_all_stats for other users' sessions). ok is false when nobody
// holds it.
func LockHolder(ctx context.Context, db *pgx.Conn, slotName string) (h Holder, ok bool, err error) {
	var app, addr *string
	var since *time.Time
	err = db.QueryRow(ctx, `
		SELECT l.pid, a.application_name, coalesce(host(a.client_addr), CASE WHEN a.pid IS NOT NULL THEN 'local' END), a.backend_start
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND l.classid = $1::bigint::oid AND l.objid = (hashtext($2)::bigint & 4294967295)::oid
		LIMIT 1`, LockClass, slotName).Scan(&h.PID, &app, &addr, &since)
	if errors.Is(err, pgx.ErrNoRows) {
		return h, false, nil
	}
	if err != nil {
		return h, false, fmt.Errorf("look up the slot lock's holder: %w", err)
	}
	h.ApplicationName, h.ClientAddr = deref(app), deref(addr)
	if since != nil {
		h.Since = *since
	}
	return h, true, nil
}
