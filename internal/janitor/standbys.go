package janitor

import (
	"context"
	"fmt"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// This file holds marks back until the standbys that PostgreSQL 17+ keeps
// failover slots in step for have them (synchronized_standby_slots).
//
// The slot may pass an event only once its row is marked (invariant 10,
// docs/architecture.md). With a failover slot, the position that counts
// after a promotion is the one synced to the standby: a mark committed on
// the primary but not yet flushed on the standby is lost by a promotion,
// while the synced slot may already be past its row, which then stays
// unpublished-looking behind the slot for good. PostgreSQL's walsender
// already holds logical changes back until the standbys named in
// synchronized_standby_slots have flushed them; the janitor does the same
// for its marks before it calls their done.

// markLSNSQL returns the standby slots to wait for: "" unless the relay's
// slot ($1) is a failover slot here (the walsender of any other slot does
// not wait for those standbys either), before PostgreSQL 17 (no failover
// column, pgcaps.Caps.FailoverSlots: to_jsonb reads it as NULL), or when
// unset; and, when there is something to wait for (those slots, or a
// standby that holds the slot: $2), a WAL position past the commit of
// every transaction this connection committed. A relay with neither never
// calls a WAL function.
const markLSNSQL = `WITH w AS (SELECT CASE WHEN (SELECT (to_jsonb(s)->>'failover')::bool FROM pg_replication_slots s WHERE slot_name = $1)
	     THEN coalesce(current_setting('synchronized_standby_slots', true), '') ELSE '' END AS standbys)
SELECT CASE WHEN $2 OR w.standbys <> '' THEN pg_current_wal_insert_lsn()::text ELSE '' END, w.standbys FROM w`

// behindSQL counts the standby slots that have not flushed $1: a physical
// slot's restart_lsn is what its standby reported flushed. A slot that is
// missing counts as behind, as it does for the walsender.
const behindSQL = `SELECT coalesce(array_agg(n), '{}') FROM unnest($2::text[]) AS n
LEFT JOIN pg_replication_slots s ON s.slot_name = n
WHERE s.restart_lsn IS NULL OR s.restart_lsn < $1::pg_lsn`

// standbyPoll is how often a waiting flush asks again; standbyWarn is how
// long it waits before it says so.
const (
	standbyPoll = 10 * time.Millisecond
	standbyWarn = 5 * time.Second
)

// markPosition returns a WAL position past the commit of the marks this
// connection wrote ("" when nothing waits for it), and
// synchronized_standby_slots when the relay's slot is a failover slot (""
// otherwise): one round trip per flushed batch.
func (j *Janitor) markPosition(ctx context.Context) (lsn, standbys string, err error) {
	if err := j.db.QueryRow(ctx, markLSNSQL, j.opts.Slot, j.opts.SlotDatabaseURL != "").Scan(&lsn, &standbys); err != nil {
		return "", "", fmt.Errorf("read the marks' WAL position: %w", err)
	}
	return lsn, standbys, nil
}

// awaitStandbys returns once every standby slot named in setting
// (synchronized_standby_slots, split) has flushed lsn, or ctx ends.
func (j *Janitor) awaitStandbys(ctx context.Context, lsn, setting string) error {
	names := slot.StandbySlots(setting)
	if len(names) == 0 {
		return nil
	}
	began := time.Now()
	warned := false
	defer j.awaitingStandby(began, nil)
	for {
		var behind []string
		if err := j.db.QueryRow(ctx, behindSQL, lsn, names).Scan(&behind); err != nil {
			return fmt.Errorf("ask whether the standbys have the marks: %w", err)
		}
		if len(behind) == 0 {
			if warned {
				j.log.Info("the standbys have the marks; the slot may pass them", "waited", time.Since(began).Round(time.Millisecond))
			}
			return nil
		}
		if !warned && time.Since(began) > standbyWarn {
			warned = true
			j.log.Warn("marks wait for standbys in synchronized_standby_slots to flush them before the slot may pass their rows", "behind", behind, "lsn", lsn)
			j.awaitingStandby(began, &WaitError{What: fmt.Sprintf("the standbys of synchronized_standby_slots %v have not flushed the marks up to %s yet", behind, lsn)})
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(standbyPoll):
		}
	}
}
