package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// This file keeps the slot a failover slot where CDCRELAY_SLOT_FAILOVER
// asks for one (PostgreSQL 17+), and notices promotions.

// wantFailover decides from CDCRELAY_SLOT_FAILOVER whether the slot should
// be a failover slot on server s: "auto" where the server can keep one,
// "on" the same but a server that cannot is a fatal configuration error.
func wantFailover(setting string, s pgcaps.Caps) (bool, error) {
	switch setting {
	case config.SlotFailoverOff:
		return false, nil
	case config.SlotFailoverOn:
		if !s.CanFailover() {
			return false, fmt.Errorf("%w: CDCRELAY_SLOT_FAILOVER=on needs a PostgreSQL 17 or later primary, and the slot's server is %s; set it to auto or off", slot.ErrFailoverUnsupported, s)
		}
	}
	return s.CanFailover(), nil
}

// inactiveWait bounds how long a session waits for a previous holder's
// walsender to let go of the slot before converting it: the conversion
// would block behind it.
const inactiveWait = 10 * time.Second

// applyFailover makes the slot a failover slot, or not, as the setting
// asks, keeping its position (no adoption again). It runs after an
// adoption has ended, never before: a slot synced to a standby while its
// backlog was still being published would, after a promotion, resume past
// rows never published (the adoption marker is a physical slot, which is
// never synced). A slot still streamed by a previous holder is left as it
// is for this session; the next one tries again.
func (r *Relay) applyFailover(ctx context.Context, sdb *pgx.Conn, repl *pgconn.PgConn, server pgcaps.Caps, info slot.Info) error {
	want, err := wantFailover(r.cfg.SlotFailover, server)
	if err != nil {
		return err
	}
	if info.Failover == want || (!want && !server.CanFailover()) {
		return nil // as asked, or a server where failover means nothing
	}
	if inactive, err := r.waitInactive(ctx, sdb); err != nil || !inactive {
		if err == nil {
			r.log.Warn("the slot is still streamed by its previous holder; failover is set at the next session", "failover", want, "waited", inactiveWait)
		}
		return err
	}
	if err := slot.SetFailover(ctx, repl, r.cfg.Slot, want); err != nil {
		return err
	}
	r.log.Info("set the slot's failover", "failover", want, "server", server.String())
	return nil
}

// waitInactive waits up to inactiveWait until no process streams the slot.
func (r *Relay) waitInactive(ctx context.Context, db *pgx.Conn) (bool, error) {
	deadline := time.Now().Add(inactiveWait)
	for {
		var active bool
		err := db.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.Slot).Scan(&active)
		if err != nil {
			return false, fmt.Errorf("look up whether slot %s is streamed: %w", r.cfg.Slot, err)
		}
		if !active || time.Now().After(deadline) {
			return !active, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// noteSystem records the system and timeline the replication connection
// reached, and warns when they changed since the last session: a standby
// was promoted (the timeline grows), or the URL now reaches another
// database system altogether.
func (r *Relay) noteSystem(sys slot.System, info slot.Info) {
	r.metrics.timeline.Set(float64(sys.Timeline))
	prev := r.system
	r.system = sys
	switch {
	case prev.ID == "":
		r.log.Info("connected to PostgreSQL", "system", sys.ID, "timeline", sys.Timeline)
	case prev.ID != sys.ID:
		r.log.Warn("the replication connection reaches another database system than the last session's", "system", sys.ID, "previous_system", prev.ID, "timeline", sys.Timeline)
	case prev.Timeline != sys.Timeline:
		r.log.Warn("the server's timeline changed: a standby was promoted", "timeline", sys.Timeline, "previous_timeline", prev.Timeline,
			"slot_exists", info.Exists, "slot_synced", info.Synced, "slot_failover", info.Failover)
	}
	if info.Exists && info.Synced {
		r.log.Info("resuming from a slot synchronized from the former primary", "confirmed_flush", info.ConfirmedFlush)
	}
}

// anchor names to publish.Carryover the stream this session reads: the
// database system and timeline of the replication connection, when the
// slot's server (and the primary, when the slot is on a standby) last
// started, and whether the stream skips transactions with an origin.
// Carryover drops every remembered place when the stream is not the one they
// were learned from: a promoted standby's new timeline reuses the LSNs of
// events it never received, a restart after a crash may have undone marks,
// and a stream that skipped origins never saw a foreign origin's inserts
// that a stream decoding them must publish (docs/architecture.md, "What the
// relay remembers"). Runs after decideOrigins.
func (r *Relay) anchor(ctx context.Context, db, sdb *pgx.Conn, server pgcaps.Caps, sys slot.System) error {
	origins := "any"
	if r.skipOrigins {
		origins = "none"
	}
	key := fmt.Sprintf("system %s, timeline %d, started %s, origins %s", sys.ID, sys.Timeline, server.Started.UTC().Format(time.RFC3339Nano), origins)
	if sdb != db {
		var primary time.Time
		if err := db.QueryRow(ctx, `SELECT pg_postmaster_start_time()`).Scan(&primary); err != nil {
			return fmt.Errorf("read when the primary started: %w", err)
		}
		key += ", primary started " + primary.UTC().Format(time.RFC3339Nano)
	}
	if r.carryover.Anchor(key) {
		r.log.Warn("the stream is not the one earlier sessions read (a promotion, a restart, another database system, or origins decoded or skipped): every event the slot replays is published again, none skipped as done",
			"stream", key)
	}
	return nil
}
