package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/pgerr"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// This file puts the slot on a physical standby (CDCRELAY_REPLICATION_URL,
// PostgreSQL 16+): the replication connection, the slot, its adoption
// marker and the snapshot's backlog are the standby's, while the
// publication, the slot lock, the marks, retention and the monitor's
// backlog stay on the primary. The janitor confirms a mark only once the
// standby shows it (janitor/replica.go), so a promotion of the standby
// never leaves a row unmarked behind the slot.

// connectSlotDB opens the normal connection to the server that holds the
// slot: db itself without CDCRELAY_REPLICATION_URL.
func (r *Relay) connectSlotDB(ctx context.Context, db *pgx.Conn) (*pgx.Conn, error) {
	if r.cfg.ReplicationURL == "" {
		return db, nil
	}
	sdb, err := pgconnect.Connect(ctx, r.cfg.ReplicationURL, "to the replication server (CDCRELAY_REPLICATION_URL)", pgconnect.Options{})
	if err != nil {
		r.metrics.connectFailures.WithLabelValues("postgres").Inc()
		return nil, err
	}
	return sdb, nil
}

// slotServer probes the server that holds the slot (pgcaps.Probe, once
// per session: the session hands the result to what needs it) and, when
// it is not the primary's connection, refuses one that cannot hold it for
// this primary: another database system, a standby older than 16
// (pgcaps.Caps.DecodesOnStandby), one without wal_level=logical or
// hot_standby_feedback (without feedback the primary vacuums catalog rows
// the slot needs and PostgreSQL invalidates it).
func (r *Relay) slotServer(ctx context.Context, db, sdb *pgx.Conn) (pgcaps.Caps, error) {
	server, err := pgcaps.Probe(ctx, sdb)
	if err != nil {
		return server, err
	}
	if _, err := wantFailover(r.cfg.SlotFailover, server); err != nil {
		return server, err
	}
	if sdb == db {
		return server, nil
	}
	var primaryID, id, walLevel, feedback string
	if err := db.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&primaryID); err != nil {
		return server, fmt.Errorf("read the primary's system identifier: %w", err)
	}
	err = sdb.QueryRow(ctx, `SELECT system_identifier::text, current_setting('wal_level'), current_setting('hot_standby_feedback') FROM pg_control_system()`).
		Scan(&id, &walLevel, &feedback)
	if err != nil {
		return server, fmt.Errorf("read the replication server's system identifier: %w", err)
	}
	switch {
	case id != primaryID:
		return server, fmt.Errorf("%w: CDCRELAY_REPLICATION_URL reaches database system %s and CDCRELAY_DATABASE_URL system %s; the replication server must be a physical standby of the primary", slot.ErrSlotServer, id, primaryID)
	case !server.InRecovery:
		// A standby promoted since: it is the primary now (DATABASE_URL
		// reaches it too, with target_session_attrs=read-write).
		r.log.Info("the replication server is not a standby (promoted?); streaming from it as from a primary", "server", server.String())
	case !server.DecodesOnStandby():
		return server, fmt.Errorf("%w: the replication server is %s; logical decoding on a standby needs PostgreSQL 16 or later; unset CDCRELAY_REPLICATION_URL", slot.ErrSlotServer, server)
	case walLevel != "logical":
		return server, fmt.Errorf("%w: the standby has wal_level=%s; set wal_level = logical on the standby too (and restart it)", slot.ErrSlotServer, walLevel)
	case feedback != "on":
		return server, fmt.Errorf("%w: the standby has hot_standby_feedback=%s; without it the primary removes catalog rows the slot needs and PostgreSQL invalidates the slot: set hot_standby_feedback = on (and a primary_slot_name)", slot.ErrSlotServer, feedback)
	}
	return server, nil
}

// replayWait bounds how long a new slot waits for the standby to replay
// the primary's position (where the publication exists).
const replayWait = 5 * time.Minute

// awaitReplay waits until the standby has replayed the primary's current
// WAL position: decoding looks the publication up as of each change, so
// the standby must have it before the slot exists.
func (r *Relay) awaitReplay(ctx context.Context, db, sdb *pgx.Conn) error {
	var target pglogrepl.LSN
	if err := db.QueryRow(ctx, `SELECT pg_current_wal_lsn()`).Scan(&target); err != nil {
		return fmt.Errorf("read the primary's WAL position: %w", err)
	}
	began := time.Now()
	for {
		var done bool
		if err := sdb.QueryRow(ctx, `SELECT NOT pg_is_in_recovery() OR pg_last_wal_replay_lsn() >= $1::pg_lsn`, target.String()).Scan(&done); err != nil {
			return fmt.Errorf("ask whether the standby replayed %s: %w", target, err)
		}
		waited := time.Since(began)
		switch {
		case done:
			r.clearDetail()
			return nil
		case waited > replayWait:
			return fmt.Errorf("the standby has not replayed the primary's position %s within %s: is it streaming from the primary?", target, replayWait)
		case waited > createReportAfter:
			r.setDetail(ReasonCreatingSlot, fmt.Sprintf("waiting %s for the standby to replay the primary's position %s before creating the slot there", waited.Round(time.Second), target))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// nudgeEvery is how often the relay asks the primary for a running-xacts
// record while the slot is being created on a standby.
const nudgeEvery = time.Second

// nudgeStandby asks the primary, every nudgeEvery until stopped, to log a
// standby snapshot (pg_log_standby_snapshot()): creating a slot on a
// standby waits for the primary's next running-xacts record, which an idle
// primary may not write for a long time. It says so in Status, and names
// the grant once if the role lacks it. db is the primary's connection,
// free while the slot is created; it is free again once stop returns.
func (r *Relay) nudgeStandby(ctx context.Context, db *pgx.Conn) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	began := time.Now()
	go func() {
		defer close(done)
		denied := false
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-time.After(nudgeEvery):
			}
			what := fmt.Sprintf("creating replication slot %s on the standby has waited %s for a running-xacts record from the primary", r.cfg.Slot, time.Since(began).Round(time.Second))
			qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_, err := db.Exec(qctx, `SELECT pg_log_standby_snapshot()`)
			cancel()
			var pgErr *pgconn.PgError
			switch {
			case err == nil:
				what += "; the relay asks for one with pg_log_standby_snapshot() every second"
			case errors.As(err, &pgErr) && pgErr.Code == pgerr.InsufficientPrivilege:
				what += "; the role may not call pg_log_standby_snapshot(): GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO <role> (in the database of CDCRELAY_DATABASE_URL)"
				if !denied {
					denied = true
					r.log.Warn("cannot ask the primary for a standby snapshot; slot creation on the standby waits for the primary to write one by itself", "error", err,
						"remedy", "GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO <the relay's role>")
				}
			default:
				what += fmt.Sprintf("; asking the primary for one failed: %v", err)
			}
			if time.Since(began) > createReportAfter {
				r.setDetail(ReasonCreatingSlot, what)
			}
		}
	}()
	return func() {
		close(quit)
		<-done
		r.clearDetail()
	}
}
