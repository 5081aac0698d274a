package slot

import (
	"context"
	"encoding/json"
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

// Info is what the catalog says about the slot (ReadSlot); SlotProblems
// judges it.
type Info struct {
	Exists bool
	// Type and Plugin are pg_replication_slots.slot_type and plugin;
	// Database is the slot's database ("" for a physical slot), and
	// CurrentDatabase that of the session that read it.
	Type, Plugin, Database, CurrentDatabase string
	Temporary                               bool
	Active                                  bool // a walsender holds it (another relay streams)
	ActivePID                               int
	// WALStatus is wal_status ("" before PostgreSQL 13); Retained the WAL
	// the slot holds back, e.g. "12 MB" ("" when unknown, as on a standby).
	WALStatus, Retained string
	Lost                bool // invalidated: wal_status = lost (max_slot_wal_keep_size), or a recovery conflict (16+)
	ConfirmedFlush      pglogrepl.LSN
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
	tf, err := readTable(ctx, db, t)
	if err != nil {
		return false, err
	}
	if err := refusal(TableProblems(Scope{Outbox: t}, tf, PublicationFacts{})); err != nil {
		return false, err
	}
	if _, err := db.Exec(ctx, createPublicationSQL(t.Publication, tf.Relation)); err != nil {
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

// Inspect reads the slot's state (ReadSlot) and refuses it on its first
// fatal problem (SlotProblems): a slot of another kind or database, a
// temporary one, or, unless recreateLost (CDCRELAY_SLOT_LOST=recreate),
// an invalidated one.
func Inspect(ctx context.Context, db *pgx.Conn, t config.Outbox, recreateLost bool) (Info, error) {
	info, err := ReadSlot(ctx, db, t.Slot)
	if err != nil {
		return info, err
	}
	return info, refusal(SlotProblems(Scope{Outbox: t, RecreateLost: recreateLost}, info))
}

// ReadSlot reads the slot named name and its adoption marker
// (config.AdoptionMarkerName). The columns PostgreSQL added after 13 are read through
// to_jsonb, so one statement serves every version: a missing one is NULL
// (conflicting from 16, pgcaps.Caps.DecodesOnStandby; failover, synced and
// invalidation_reason from 17, pgcaps.Caps.FailoverSlots).
func ReadSlot(ctx context.Context, db *pgx.Conn, name string) (Info, error) {
	var info Info
	var raw []byte
	var retained *string
	err := db.QueryRow(ctx, `
		SELECT current_database(), EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $2),
		       (SELECT to_jsonb(s) FROM pg_replication_slots s WHERE slot_name = $1),
		       (SELECT CASE WHEN pg_is_in_recovery() OR s.restart_lsn IS NULL THEN NULL
		                    ELSE pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)) END
		        FROM pg_replication_slots s WHERE slot_name = $1)`, name, config.AdoptionMarkerName(name)).
		Scan(&info.CurrentDatabase, &info.Adopting, &raw, &retained)
	if err != nil {
		return info, fmt.Errorf("look up replication slot %s: %w", name, err)
	}
	if raw == nil {
		return info, nil
	}
	var row struct {
		Type        string  `json:"slot_type"`
		Plugin      *string `json:"plugin"`
		Database    *string `json:"database"`
		Temporary   bool    `json:"temporary"`
		Active      bool    `json:"active"`
		ActivePID   *int    `json:"active_pid"`
		Confirmed   *string `json:"confirmed_flush_lsn"`
		WALStatus   *string `json:"wal_status"`          // 13+
		Conflicting *bool   `json:"conflicting"`         // 16+: DecodesOnStandby
		Reason      *string `json:"invalidation_reason"` // 17+: FailoverSlots
		Failover    *bool   `json:"failover"`            // 17+: FailoverSlots
		Synced      *bool   `json:"synced"`              // 17+: FailoverSlots
	}
	if err := json.Unmarshal(raw, &row); err != nil {
		return info, fmt.Errorf("decode pg_replication_slots row: %w", err)
	}
	info.Exists, info.Type, info.Temporary, info.Active = true, row.Type, row.Temporary, row.Active
	info.Plugin, info.Database, info.WALStatus, info.Retained = deref(row.Plugin), deref(row.Database), deref(row.WALStatus), deref(retained)
	if row.ActivePID != nil {
		info.ActivePID = *row.ActivePID
	}
	info.Failover, info.Synced = derefBool(row.Failover), derefBool(row.Synced)
	info.Invalidation = invalidation(info.WALStatus, derefBool(row.Conflicting), deref(row.Reason))
	info.Lost = info.Invalidation != ""
	if row.Confirmed != nil {
		if info.ConfirmedFlush, err = pglogrepl.ParseLSN(*row.Confirmed); err != nil {
			return info, fmt.Errorf("parse confirmed_flush_lsn %q: %w", *row.Confirmed, err)
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
	// FirstIndex is the index of the backlog's first row: 0 for a new
	// slot; for the backlog of an adoption resumed on the same slot, past
	// every index an earlier attempt gave, so that no (commit LSN, index)
	// pair names two events (invariant 12, docs/architecture.md).
	FirstIndex int
}

// Create makes the permanent pgoutput slot on the replication connection,
// exporting its snapshot so the rows committed before it can be published
// first (invariant 7, docs/architecture.md).
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
