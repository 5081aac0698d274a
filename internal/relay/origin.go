package relay

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
)

// decideOrigins decides whether this session's stream asks pgoutput for
// origin 'none': the walsender then skips, before its reorder buffer,
// every transaction that carries a replication origin, which is what the
// janitor's marks and retention's deletes carry (CDCRELAY_MARK_ORIGIN,
// pgconnect.SetupOrigin). Only where the role may use origins (else the
// marks carry none and there is nothing to skip) and every origin of the
// cluster is a relay's: a transaction with another origin (a
// subscription's apply worker, say) may insert outbox rows, which the
// stream must never skip. The decision holds for the session's start
// only: an origin created later is the origin gate's (origingate.go).
// sdb is the server that decodes, server its probe (pgcaps.Caps.OriginNone).
func (r *Relay) decideOrigins(ctx context.Context, sdb *pgx.Conn, server pgcaps.Caps) (bool, error) {
	// The decision names the stream publish.Carryover's places belong to
	// (Relay.anchor): places learned from a stream that skipped every
	// transaction with an origin say nothing of the transactions it never
	// saw, and a stream that decodes them must not skip them as done.
	if r.cfg.MarkOrigin == config.MarkOriginOff || !server.OriginNone() {
		return false, nil
	}
	if usable, err := pgconnect.OriginsUsable(ctx, sdb, server); err != nil || !usable {
		return false, err
	}
	only, others, err := pgconnect.OnlyRelayOrigins(ctx, sdb)
	if err != nil {
		return false, err
	}
	if !only {
		r.originMemo.seen.Store(true)
		if key := strings.Join(others, ","); key != r.originsNoted {
			r.originsNoted = key
			r.log.Warn("the cluster has replication origins that are not a relay's: the stream decodes every transaction, the marks' too, so that none of their inserts is missed", "origins", key)
		}
		return false, nil
	}
	passed, err := r.originMemo.passed(ctx, sdb, r.cfg.Slot, r.log.Info)
	if err != nil || !passed {
		return false, err
	}
	r.log.Debug("the stream asks pgoutput for origin 'none': every replication origin of the cluster is a relay's")
	return true, nil
}

// originMemory is what a foreign origin leaves behind once it is gone
// (docs/architecture.md, "What the relay remembers": foreign origins seen).
// The walsender filters by the origin id written in each WAL record, not
// by the catalog: the transactions of an origin dropped since it was seen
// still lie ahead of the slot when the slot has not passed them (a gate
// ended the session before it confirmed past them, or a session that
// decoded them failed first). So after a foreign origin was seen, the
// stream decodes every origin until the slot has passed the WAL written
// when the relay first found it gone. Kept in memory: a process that
// restarts meanwhile forgets it (docs/configuration.md states the limit).
type originMemory struct {
	// seen: a foreign origin was seen since the last decideOrigins. Set
	// by decideOrigins and by a session's origin gate from its own
	// goroutine, hence atomic.
	seen atomic.Bool
	// until: decode every origin until the slot's confirmed position
	// reaches it; 0 when nothing is owed. Run goroutine only.
	until pglogrepl.LSN
}

// walNowSQL is the end of the WAL the server has: written on a primary,
// replayed on a standby (the only WAL its walsenders decode).
const walNowSQL = `SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END`

// confirmedOrSQL is the slot's confirmed position, or $2 when there is no
// slot: the one the session creates starts past every WAL written now,
// and its snapshot backfill reads the rows before it whatever their origin.
const confirmedOrSQL = `SELECT coalesce((SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1), $2::pg_lsn)`

// passed reports whether a stream may skip origins again as far as
// foreign origins seen earlier go: none was, or the slot has passed the
// WAL in which their transactions may lie. Every foreign origin is gone
// now (the caller found none), and an origin in use cannot be dropped, so
// every record written under one lies before the WAL's end read here.
func (m *originMemory) passed(ctx context.Context, sdb *pgx.Conn, slotName string, info func(string, ...any)) (bool, error) {
	if m.seen.Load() {
		var now pglogrepl.LSN
		if err := sdb.QueryRow(ctx, walNowSQL).Scan(&now); err != nil {
			return false, fmt.Errorf("read the WAL position after a foreign replication origin went away: %w", err)
		}
		m.seen.Store(false)
		m.until = max(m.until, now)
		info("the replication origins that are not a relay's are gone; the stream decodes every origin until the slot passes the WAL they may have written", "until", now)
	}
	if m.until == 0 {
		return true, nil
	}
	var confirmed pglogrepl.LSN
	if err := sdb.QueryRow(ctx, confirmedOrSQL, slotName, m.until).Scan(&confirmed); err != nil {
		return false, fmt.Errorf("read slot %s's confirmed position: %w", slotName, err)
	}
	if confirmed < m.until {
		return false, nil
	}
	m.until = 0
	return true, nil
}
