package slot

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgerr"
)

// Errors about the slot that no retry can fix.
var (
	ErrSlotMismatch = errors.New("replication slot is not usable by this relay")
	ErrSlotLost     = errors.New("replication slot was invalidated")
)

// ErrBusy means another process holds the slot or is adopting it: this
// relay is a hot standby and should try again later.
var ErrBusy = errors.New("replication slot is in use by another relay")

// Info is what Inspect found about the slot.
type Info struct {
	Exists         bool
	Active         bool // a walsender holds it (another relay streams)
	Lost           bool // invalidated: wal_status = lost (max_slot_wal_keep_size), or a recovery conflict (16+)
	ConfirmedFlush pglogrepl.LSN
	// Failover: a failover slot (17+), kept in step on standbys with
	// sync_replication_slots. Synced: it was synchronized from a primary;
	// on a primary that means this server was promoted since.
	Failover, Synced bool
	// Invalidation says why PostgreSQL invalidated the slot, when it did:
	// invalidation_reason (17+), "conflicting" (16) or "wal_status lost".
	Invalidation string
	// Adopting is set when an adoption marker exists: a relay created the
	// slot and had not finished publishing the snapshot's backlog.
	Adopting bool
}

// EnsurePublication creates the publication for the outbox table, inserts
// only (through the root when partitioned), unless it exists. It must
// exist before the slot: decoding looks the publication up by name as of
// each change.
func EnsurePublication(ctx context.Context, db *pgx.Conn, t config.Outbox) (bool, error) {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, t.Publication).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up publication %s: %w", t.Publication, err)
	}
	if exists {
		return false, nil
	}
	table, found, err := ResolveTable(ctx, db, t)
	if err != nil {
		return false, err
	}
	if !found {
		_, err := CheckPublication(t.Publication, table, false, PublicationFacts{})
		return false, err
	}
	if _, err := db.Exec(ctx, createPublicationSQL(t.Publication, table)); err != nil {
		if pgCode(err) == pgerr.DuplicateObject { // created concurrently by another replica
			return false, nil
		}
		return false, fmt.Errorf("create publication %s (create it as the table owner, e.g. with cdcrelay migrate): %w", t.Publication, err)
	}
	return true, nil
}

// StatusInterval is the longest the relay may stay silent on the
// replication connection: half of wal_sender_timeout, capped by limit.
func StatusInterval(ctx context.Context, db *pgx.Conn, limit time.Duration) (time.Duration, error) {
	var ms int64
	if err := db.QueryRow(ctx, `SELECT setting::bigint FROM pg_settings WHERE name = 'wal_sender_timeout'`).Scan(&ms); err != nil {
		return 0, fmt.Errorf("read wal_sender_timeout: %w", err)
	}
	if half := time.Duration(ms) * time.Millisecond / 2; half > 0 && half < limit {
		return half, nil
	}
	return limit, nil
}

// Inspect reads the slot's state and refuses a slot of another kind.
func Inspect(ctx context.Context, db *pgx.Conn, t config.Outbox) (Info, error) {
	var info Info
	var plugin, slotType, walStatus, confirmed, reason *string
	var sameDB, conflicting, failover, synced *bool
	// The columns PostgreSQL added after 13 are read through to_jsonb, so
	// one statement serves every version: a missing one is NULL.
	err := db.QueryRow(ctx, `
		SELECT plugin, slot_type, database = current_database(), active, confirmed_flush_lsn::text, wal_status,
		       EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $2),
		       (to_jsonb(s)->>'conflicting')::bool, to_jsonb(s)->>'invalidation_reason',
		       (to_jsonb(s)->>'failover')::bool, (to_jsonb(s)->>'synced')::bool
		FROM pg_replication_slots s WHERE slot_name = $1`, t.Slot, MarkerName(t.Slot)).
		Scan(&plugin, &slotType, &sameDB, &info.Active, &confirmed, &walStatus, &info.Adopting,
			&conflicting, &reason, &failover, &synced)
	if errors.Is(err, pgx.ErrNoRows) {
		err = db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, MarkerName(t.Slot)).Scan(&info.Adopting)
		if err != nil {
			return info, fmt.Errorf("look up adoption marker: %w", err)
		}
		return info, nil
	}
	if err != nil {
		return info, fmt.Errorf("look up replication slot %s: %w", t.Slot, err)
	}
	info.Exists = true
	switch {
	case deref(slotType) != "logical" || deref(plugin) != "pgoutput":
		return info, fmt.Errorf("%w: slot %s is a %s slot with plugin %q; want logical with pgoutput", ErrSlotMismatch, t.Slot, deref(slotType), deref(plugin))
	case sameDB == nil || !*sameDB:
		return info, fmt.Errorf("%w: slot %s belongs to another database", ErrSlotMismatch, t.Slot)
	}
	info.Failover, info.Synced = derefBool(failover), derefBool(synced)
	info.Invalidation = invalidation(deref(walStatus), derefBool(conflicting), deref(reason))
	info.Lost = info.Invalidation != ""
	if confirmed != nil {
		if info.ConfirmedFlush, err = pglogrepl.ParseLSN(*confirmed); err != nil {
			return info, fmt.Errorf("parse confirmed_flush_lsn %q: %w", *confirmed, err)
		}
	}
	return info, nil
}

// Drop removes the slot (an invalidated one, or one whose adoption was
// interrupted). A slot held by another process is ErrBusy.
func Drop(ctx context.Context, db *pgx.Conn, slotName string) error {
	if _, err := db.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slotName); err != nil {
		switch pgCode(err) {
		case pgerr.ObjectInUse:
			return fmt.Errorf("%w: %w", ErrBusy, err)
		case pgerr.UndefinedObject: // already gone
			return nil
		}
		return fmt.Errorf("drop replication slot %s: %w", slotName, err)
	}
	return nil
}

// Created is a slot made by Create with the snapshot it exported.
type Created struct {
	ConsistentPoint pglogrepl.LSN
	// Snapshot holds exactly the rows committed before ConsistentPoint. It
	// stays importable until the next command on the replication connection.
	Snapshot string
}

// Create makes the permanent pgoutput slot on the replication connection,
// exporting its snapshot so the rows committed before it can be published
// first (docs/architecture.md invariant 7).
func Create(ctx context.Context, repl *pgconn.PgConn, slotName string) (Created, error) {
	res, err := pglogrepl.CreateReplicationSlot(ctx, repl, slotName, "pgoutput", pglogrepl.CreateReplicationSlotOptions{
		Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT",
	})
	if err != nil {
		if pgCode(err) == pgerr.DuplicateObject {
			return Created{}, fmt.Errorf("%w: slot %s was created concurrently", ErrBusy, slotName)
		}
		return Created{}, fmt.Errorf("create replication slot %s: %w", slotName, err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return Created{}, fmt.Errorf("parse consistent point %q: %w", res.ConsistentPoint, err)
	}
	return Created{ConsistentPoint: lsn, Snapshot: res.SnapshotName}, nil
}

func pgCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// invalidation names why a slot is unusable, "" when it is not: a slot
// whose WAL was removed (wal_status lost, every version), or, on a standby
// or a promoted one, whose catalog rows were vacuumed away (16's
// conflicting, 17's invalidation_reason, which names both and more).
func invalidation(walStatus string, conflicting bool, reason string) string {
	switch {
	case reason != "":
		return reason
	case conflicting:
		return "conflicting"
	case walStatus == "lost":
		return "wal_status lost"
	}
	return ""
}

func derefBool(b *bool) bool { return b != nil && *b }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
