package slot

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Errors about the slot that no retry can fix.
var (
	ErrSlotMismatch = errors.New("replication slot is not usable by this relay")
	ErrSlotLost     = errors.New("replication slot was invalidated")
)

// Target names what the relay streams from.
type Target struct {
	Publication string
	Slot        string
	Schema      string
	Table       string
}

// State is what EnsureSlot found or made.
type State struct {
	Created        bool
	ConfirmedFlush pglogrepl.LSN
	// StatusInterval is the longest the relay may stay silent on the
	// replication connection: half of wal_sender_timeout, capped by the
	// configured interval.
	StatusInterval time.Duration
}

// EnsurePublication creates the publication for the outbox table, inserts
// only, unless it exists. It must exist before the slot: decoding looks the
// publication up by name as of each change.
func EnsurePublication(ctx context.Context, db *pgx.Conn, t Target) (bool, error) {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, t.Publication).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up publication %s: %w", t.Publication, err)
	}
	if exists {
		return false, nil
	}
	sql := fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')`,
		pgx.Identifier{t.Publication}.Sanitize(), pgx.Identifier{t.Schema, t.Table}.Sanitize())
	if _, err := db.Exec(ctx, sql); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created concurrently by another replica
			return false, nil
		}
		return false, fmt.Errorf("create publication %s: %w", t.Publication, err)
	}
	return true, nil
}

// EnsureSlot creates the permanent pgoutput slot unless it exists, checks an
// existing one, and reads what the session needs to start.
func EnsureSlot(ctx context.Context, db *pgx.Conn, t Target, maxInterval time.Duration) (State, error) {
	var st State
	var walSenderTimeoutMS int64
	if err := db.QueryRow(ctx, `SELECT setting::bigint FROM pg_settings WHERE name = 'wal_sender_timeout'`).Scan(&walSenderTimeoutMS); err != nil {
		return st, fmt.Errorf("read wal_sender_timeout: %w", err)
	}
	st.StatusInterval = maxInterval
	if half := time.Duration(walSenderTimeoutMS) * time.Millisecond / 2; half > 0 && half < maxInterval {
		st.StatusInterval = half
	}

	var plugin, slotType, walStatus *string
	var sameDB bool
	var confirmed *string
	err := db.QueryRow(ctx, `
		SELECT plugin, slot_type, database = current_database(), confirmed_flush_lsn::text, wal_status
		FROM pg_replication_slots WHERE slot_name = $1`, t.Slot).Scan(&plugin, &slotType, &sameDB, &confirmed, &walStatus)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		var lsn pglogrepl.LSN
		err := db.QueryRow(ctx, `SELECT lsn FROM pg_create_logical_replication_slot($1, 'pgoutput')`, t.Slot).Scan(&lsn)
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "42710" { // created concurrently by another replica
				return EnsureSlot(ctx, db, t, maxInterval)
			}
			return st, fmt.Errorf("create replication slot %s: %w", t.Slot, err)
		}
		st.Created, st.ConfirmedFlush = true, lsn
		return st, nil
	case err != nil:
		return st, fmt.Errorf("look up replication slot %s: %w", t.Slot, err)
	}
	switch {
	case deref(slotType) != "logical" || deref(plugin) != "pgoutput":
		return st, fmt.Errorf("%w: slot %s is a %s slot with plugin %q; want logical with pgoutput", ErrSlotMismatch, t.Slot, deref(slotType), deref(plugin))
	case !sameDB:
		return st, fmt.Errorf("%w: slot %s belongs to another database", ErrSlotMismatch, t.Slot)
	case deref(walStatus) == "lost":
		return st, fmt.Errorf("%w: slot %s has wal_status=lost (max_slot_wal_keep_size); drop it and let the relay recreate it", ErrSlotLost, t.Slot)
	}
	if confirmed != nil {
		lsn, err := pglogrepl.ParseLSN(*confirmed)
		if err != nil {
			return st, fmt.Errorf("parse confirmed_flush_lsn %q: %w", *confirmed, err)
		}
		st.ConfirmedFlush = lsn
	}
	return st, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
