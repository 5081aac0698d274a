package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/adoption"
	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// This file is one session's life: the slot lock, the setup under it,
// adoption or resume, then the stream.

// session runs one pipeline. ctx ending asks for a graceful stop: read no
// more, wait up to ShutdownTimeout for in-flight confirms, confirm what was
// acked, return. Everything it does to the slot happens under the slot
// lock, taken first on a connection of its own and held until the session
// ends: a standby waits for it there, and closing it releases it.
func (r *Relay) session(ctx context.Context) (err error) {
	defer func() { err = r.classify(err) }() // last: what needs an operator (errors.go)
	lock, err := r.connectLock(ctx)
	if err != nil {
		return err
	}
	var f *fence
	// Deferred first, this runs last: the lock is released only once the
	// replication connection is closed and this relay has let go of the slot.
	defer func() {
		if f != nil {
			err = f.explain(err)
			// Still under the slot lock, which a lost lock is not (explain
			// made its error retryable): nothing else acts on the slot.
			err = r.dropMade(ctx, err)
			f.stop()
		}
		pgconnect.Close(ctx, lock)
	}()
	if err := r.acquire(ctx, lock); err != nil {
		return err
	}
	r.metrics.lockHeld.Set(1)
	defer r.metrics.lockHeld.Set(0)
	r.carryover.Begin(time.Now()) // careful for a while if the last session ended on a refusal
	// The lock's connection stays idle from here on; losing it ends the
	// session at once: work and lost are cancelled and the replication
	// socket closed. lost ends with the loss only, not with ctx: a loss
	// during the drain after a stop still stops the pipeline at once.
	work, cancelWork := context.WithCancel(ctx)
	defer cancelWork()
	lost, loseLock := context.WithCancel(context.WithoutCancel(ctx))
	defer loseLock()
	f = r.startFence(lock, func() { cancelWork(); loseLock() })

	db, err := r.connectDB(work)
	if err != nil {
		return err
	}
	// The normal connections serve the setup and the adoption only: db to
	// the primary, sdb to the server that holds the slot (db itself unless
	// CDCRELAY_REPLICATION_URL names a standby).
	sdb := db
	closeDB := func() {
		if sdb != nil && sdb != db {
			pgconnect.Close(ctx, sdb)
		}
		if db != nil {
			pgconnect.Close(ctx, db)
		}
		db, sdb = nil, nil
	}
	defer closeDB()
	if sdb, err = r.connectSlotDB(work, db); err != nil {
		return err
	}
	server, err := r.slotServer(work, db, sdb)
	if err != nil {
		return err
	}
	if r.skipOrigins, err = r.decideOrigins(work, sdb, server); err != nil {
		return err
	}
	info, interval, adopting, err := r.prepare(work, db, sdb)
	if err != nil {
		return err
	}

	repl, err := r.connectReplication(work)
	if err != nil {
		return err
	}
	f.guard(repl)
	defer func() {
		pgconnect.Close(ctx, repl)
	}()
	// Before any slot is created: a replication command ends the snapshot
	// a new slot exports.
	sys, err := slot.Identify(work, repl)
	if err != nil {
		return err
	}
	r.noteSystem(sys, info)
	if err := r.anchor(work, db, sdb, server, sys); err != nil {
		return err
	}

	// The broker is needed from here on: by the adoption, which publishes
	// the backlog before streaming, and by the stream.
	link, err := r.dial(work)
	if err != nil {
		return err
	}
	defer func() { _ = link.Close() }()
	start := info.ConfirmedFlush
	switch {
	case !info.Exists:
		if start, err = r.adopt(work, ctx, lost, db, sdb, repl, link, adopting); err != nil {
			return err
		}
	case info.Adopting:
		if err := r.resumeAdoption(work, ctx, lost, sdb, link, start); err != nil {
			return err
		}
	}
	if err := r.applyFailover(work, sdb, repl, server, info); err != nil {
		return err
	}
	closeDB()
	if err := r.startReplication(work, repl); err != nil {
		return r.classifyBusy(work, err)
	}
	r.foreignNoted = "" // a foreign holder seen again is reported at once
	// Streaming: the slot is the relay's now, whoever created it, and a
	// later fatal error keeps it (the next start goes on from it).
	r.made = madeSlot{}
	return r.stream(ctx, lost, repl, link, start, interval)
}

// prepare makes sure the publication exists, then looks at the slot, with
// the slot lock held: an invalidated slot is dropped so that it is created
// again with a snapshot backfill, and so is a slot whose adoption another
// process did not finish; one this process began is kept, and the rest of
// its backlog published (resumeAdoption). adopting reports that prepare
// already holds the adoption lock. Before a slot is
// created or dropped, canAdopt checks what an adoption needs.
func (r *Relay) prepare(ctx context.Context, db, sdb *pgx.Conn) (info slot.Info, interval time.Duration, adopting bool, err error) {
	info, interval, err = r.inspect(ctx, db, sdb)
	if info.Lost { // refused by inspect (ErrSlotLost) with CDCRELAY_SLOT_LOST=stop, else recreated below
		r.metrics.slotLost.Inc()
	}
	if err != nil {
		return info, interval, false, err
	}
	if !info.Exists {
		return info, interval, false, r.canAdopt(ctx, sdb)
	}
	switch {
	case info.Lost:
		if err := r.canAdopt(ctx, sdb); err != nil {
			return info, 0, false, err
		}
		r.log.Error("replication slot was invalidated; recreating it and publishing every unpublished row from its snapshot", "reason", info.Invalidation, "confirmed_flush", info.ConfirmedFlush)
	case info.Adopting:
		if err := r.canAdopt(ctx, sdb); err != nil {
			return info, 0, false, err
		}
		// The marker outlives an adoption that failed (a refusal, a lost
		// connection) or whose relay died: a live adopter of this version
		// holds the slot lock, which is ours, and one of an older version
		// holds the adoption lock, for which adoption.Begin reports ErrBusy.
		if err := adoption.Begin(ctx, sdb, r.cfg.Slot); err != nil {
			return info, 0, false, err
		}
		adopting = true
		if r.unfinished.resumable(r.cfg.Slot, info) {
			// This process's own attempt: the slot is kept, and
			// resumeAdoption publishes what is left of the backlog.
			r.log.Warn("the previous adoption of this slot did not finish; publishing the rest of the backlog, keeping the slot")
			return info, interval, true, nil
		}
		// Another process's (it died): the indices its backlog gave are
		// unknown, so the slot is created again, with a new consistent
		// point, and the rows' pairs stay unique.
		r.log.Warn("the previous adoption of this slot was interrupted; recreating the slot and publishing the backlog again")
	default:
		// An active slot is the dead holder's walsender on its way out (or
		// a process outside the slot lock): startReplication waits for it.
		return info, interval, false, nil
	}
	if err := slot.Drop(ctx, sdb, r.cfg.Slot); err != nil {
		return info, 0, adopting, err
	}
	r.made = madeSlot{}
	return slot.Info{}, interval, adopting, nil
}

// inspect creates the publication if needed and reads the slot's state.
// It then verifies that the publication publishes the outbox table's
// inserts and nothing that may be outbox rows under another name (else the
// session ends with a fatal ErrPublication naming the remedy), maps the
// outbox by the table's OID for this session and the foreign relations,
// whose inserts are skipped (invariant 9, docs/architecture.md).
func (r *Relay) inspect(ctx context.Context, db, sdb *pgx.Conn) (slot.Info, time.Duration, error) {
	created, err := slot.EnsurePublication(ctx, db, r.outbox)
	if err != nil {
		return slot.Info{}, 0, err
	}
	if created {
		r.log.Info("created publication", "publication", r.outbox.Publication, "table", r.cfg.Table)
	}
	interval, err := slot.StatusInterval(ctx, sdb, r.cfg.StatusInterval) // the walsender's wal_sender_timeout
	if err != nil {
		return slot.Info{}, 0, err
	}
	info, err := slot.Inspect(ctx, sdb, r.outbox, r.cfg.SlotLost == config.SlotLostRecreate)
	if err != nil {
		return info, interval, err
	}
	// Verified even when the slot is still active: with the slot lock held
	// that is a dead holder's walsender letting go, and this session will
	// stream as soon as it has.
	// The mapped columns too: a generated one is not in the stream before
	// PostgreSQL 18, and must be refused before anything is published.
	table, foreign, err := slot.VerifyPublication(ctx, db, r.outbox, r.outbox.Columns()...)
	if err != nil {
		return slot.Info{}, 0, err
	}
	// Before any slot is created (prepare, adopt): a column the relay
	// needs and the table lacks would fail only once the slot exists.
	if err := r.checkColumns(ctx, db, table); err != nil {
		return slot.Info{}, 0, err
	}
	known, err := r.classifyUnknown(ctx, db, table, foreign)
	if err != nil {
		return slot.Info{}, 0, err
	}
	r.mapping.OID, r.mapping.Foreign = table.OID, known
	return info, interval, nil
}
