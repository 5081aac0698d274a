package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/preflight"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// This file keeps a start that fails from leaving anything behind: the
// outbox's columns are judged before a slot is created, and a slot this
// process created is dropped again, with its adoption marker, when the
// relay exits on a fatal error before that slot ever streamed. A slot that
// exists for good holds WAL for good; one a failed start made serves no
// one, and the next start creates it again and publishes the same backlog
// from its snapshot (every row with published_at IS NULL), so dropping it
// loses nothing.

// checkColumns refuses, with check's own finding and remedy
// (preflight.MissingColumns), an outbox table that lacks a mapped column
// the relay needs or published_at: the backlog query or the first mark
// would fail only after the slot exists. No retry adds a column, so the
// error is fatal (wal.ErrSchema).
func (r *Relay) checkColumns(ctx context.Context, db *pgx.Conn, table slot.Relation) error {
	rows, err := db.Query(ctx, `SELECT attname::text FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped`, table.OID)
	if err != nil {
		return fmt.Errorf("read the columns of %s: %w", table.Qualified(), err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read the columns of %s: %w", table.Qualified(), err)
	}
	fs := preflight.MissingColumns(r.outbox, cols)
	if len(fs) == 0 {
		return nil
	}
	msgs := make([]string, len(fs))
	for i, f := range fs {
		msgs[i] = f.Message + " (remedy: " + f.Remedy + ")"
	}
	return fmt.Errorf("%w: %s", wal.ErrSchema, strings.Join(msgs, "; "))
}

// madeSlot is the slot this process created and has not streamed from
// yet: the only slot a fatal exit may drop. A slot found existing is never
// recorded, so a restart of a running relay never drops its slot. Run
// goroutine only.
type madeSlot struct {
	name string
	at   pglogrepl.LSN // its consistent point: still its position while it never streamed
	set  bool
}

// madeBy records that this process created the slot (adopt).
func (r *Relay) madeBy(created slot.Created) {
	r.made = madeSlot{name: r.cfg.Slot, at: created.ConsistentPoint, set: true}
}

// dropMadeWait bounds the clean-up of a failed start: it runs after the
// session's context may be done, and must not hold up the exit for long.
const dropMadeWait = 15 * time.Second

// dropMade drops, on a fatal exit (err) of a session that holds the slot
// lock, the slot this process created in this start and its adoption
// marker, and says so in the error; when it cannot, the error names both
// and the statements that drop them. It runs before the lock is released,
// so no other relay can have taken the slot over (and, seeing the marker,
// re-created it as its own) in between. ctx is the relay's: a stop is not
// a failed start and keeps the slot (the next start resumes it).
func (r *Relay) dropMade(ctx context.Context, err error) error {
	if !r.made.set || ctx.Err() != nil || !IsFatal(err) {
		return err
	}
	made := r.made
	r.made, r.unfinished = madeSlot{}, unfinishedAdoption{}
	names := []string{made.name, config.AdoptionMarkerName(made.name)}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dropMadeWait)
	defer cancel()
	if derr := r.dropSlots(dctx, made); derr != nil {
		stmts := make([]string, len(names))
		for i, n := range names {
			stmts[i] = fmt.Sprintf("SELECT pg_drop_replication_slot('%s');", n)
		}
		r.log.Error("could not drop the replication slot this failed start created; drop it by hand, or it keeps WAL for good",
			"slots", strings.Join(names, ", "), "remedy", strings.Join(stmts, " "), "error", derr)
		return fmt.Errorf("%w; this start created replication slot %s and its adoption marker %s and could not drop them (%w): drop them, or they keep WAL until the relay starts again: %s",
			err, names[0], names[1], derr, strings.Join(stmts, " "))
	}
	r.log.Error("dropped the replication slot this failed start created, and its adoption marker; the next start creates it again", "slots", strings.Join(names, ", "))
	return fmt.Errorf("%w (the replication slot %s and its adoption marker %s, which this start created, were dropped)", err, names[0], names[1])
}

// dropSlots drops made's slot and marker on the server that holds the
// slot, on connections of their own (the session's are closed by now). A
// slot whose position moved is not this start's any more, and is kept.
// The walsender of the session's replication connection may still hold
// the slot a moment after the connection closed: busy is retried.
func (r *Relay) dropSlots(ctx context.Context, made madeSlot) error {
	db, err := r.connectDB(ctx)
	if err != nil {
		return err
	}
	defer pgconnect.Close(ctx, db)
	sdb, err := r.connectSlotDB(ctx, db)
	if err != nil {
		return err
	}
	if sdb != db {
		defer pgconnect.Close(ctx, sdb)
	}
	info, err := slot.ReadSlot(ctx, sdb, made.name)
	if err != nil {
		return err
	}
	if info.Exists && info.ConfirmedFlush != made.at {
		return fmt.Errorf("slot %s is at %s, not at the consistent point %s this start created it with: kept", made.name, info.ConfirmedFlush, made.at)
	}
	for _, name := range []string{made.name, config.AdoptionMarkerName(made.name)} {
		for {
			err := slot.Drop(ctx, sdb, name)
			if err == nil {
				break
			}
			if !errors.Is(err, slot.ErrBusy) {
				return err
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("drop replication slot %s: still in use: %w", name, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}
