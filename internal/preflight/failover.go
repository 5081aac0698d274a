package preflight

import (
	"context"
	"fmt"
	"strings"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// failoverFacts is what the failover check reads on the primary.
type failoverFacts struct {
	server       pgcaps.Caps
	setting      string // CDCRELAY_SLOT_FAILOVER
	slotExists   bool
	slotFailover bool
	slotSynced   bool
	// standbySlots is synchronized_standby_slots, split; inactive are
	// those of them that no standby streams from now, missing those that
	// do not exist.
	standbySlots      []string
	inactive, missing []string
}

// failover reads the facts: the server (probed once per run), the slot's
// flags and the standbys that PostgreSQL keeps failover slots in step
// for. The flags and the setting are PostgreSQL 17's
// (pgcaps.Caps.FailoverSlots): to_jsonb and current_setting(…, true) read
// them as missing, so false and empty, before.
func (s *session) failover(ctx context.Context, setting string) (failoverFacts, error) {
	f := failoverFacts{setting: setting}
	var err error
	if f.server, err = s.probe(ctx); err != nil {
		return f, err
	}
	var standbys string
	err = s.db.QueryRow(ctx, `SELECT coalesce(current_setting('synchronized_standby_slots', true), ''),
		       EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1),
		       coalesce((SELECT (to_jsonb(s)->>'failover')::bool FROM pg_replication_slots s WHERE slot_name = $1), false),
		       coalesce((SELECT (to_jsonb(s)->>'synced')::bool FROM pg_replication_slots s WHERE slot_name = $1), false)`, s.t.slot).
		Scan(&standbys, &f.slotExists, &f.slotFailover, &f.slotSynced)
	if err != nil {
		return f, err
	}
	f.standbySlots = slot.StandbySlots(standbys)
	if len(f.standbySlots) == 0 {
		return f, nil
	}
	err = s.db.QueryRow(ctx, `SELECT
		       coalesce(array_agg(n) FILTER (WHERE s.slot_name IS NULL), '{}'),
		       coalesce(array_agg(n) FILTER (WHERE s.slot_name IS NOT NULL AND NOT s.active), '{}')
		FROM unnest($1::text[]) AS n LEFT JOIN pg_replication_slots s ON s.slot_name = n AND s.slot_type = 'physical'`, f.standbySlots).
		Scan(&f.missing, &f.inactive)
	return f, err
}

// standbyNeeds is what a physical standby needs to keep a failover slot
// in step and take it over at a promotion.
const standbyNeeds = "on each standby that may be promoted: sync_replication_slots = on, hot_standby_feedback = on, primary_slot_name set, and dbname=<database> in primary_conninfo"

// classifyFailover says whether the slot is (or will be) a failover slot
// and what is missing for a promotion to keep it.
func classifyFailover(t target, f failoverFacts) []Finding {
	can := f.server.CanFailover()
	want := can && f.setting != config.SlotFailoverOff
	switch {
	case f.setting == config.SlotFailoverOn && !can:
		return []Finding{{Check: checkFailover, Severity: Error,
			Message: fmt.Sprintf("CDCRELAY_SLOT_FAILOVER=on, but the server is %s: failover slots need a PostgreSQL 17 or later primary, and the relay exits at start", f.server),
			Remedy:  "set CDCRELAY_SLOT_FAILOVER=auto (or off), or upgrade to PostgreSQL 17"}}
	case f.server.InRecovery:
		return []Finding{{Check: checkFailover,
			Message: fmt.Sprintf("the slot is on a standby (%s): failover slots do not apply; a promotion of that standby keeps the slot, and the janitor confirms marks only once the standby shows them", f.server)}}
	case !can:
		return []Finding{{Check: checkFailover,
			Message: fmt.Sprintf("%s: no failover slot (they need a PostgreSQL 17 or later primary); after a failover to a standby the relay creates a new slot and publishes every row with published_at IS NULL again (duplicates, no loss)", f.server)}}
	case !want:
		return []Finding{{Check: checkFailover,
			Message: fmt.Sprintf("%s, CDCRELAY_SLOT_FAILOVER=off: slot %s is not a failover slot%s; after a failover the relay creates a new slot and publishes every unpublished row again", f.server, t.slot, convertNote(f.slotExists && f.slotFailover, "off"))}}
	}
	fs := []Finding{{Check: checkFailover,
		Message: fmt.Sprintf("%s: slot %s is a failover slot%s; a standby that keeps it in step lets the relay resume after a promotion without publishing the backlog again", f.server, t.slot, convertNote(f.slotExists && !f.slotFailover, "on"))}}
	if f.slotSynced {
		fs[0].Message += fmt.Sprintf("; slot %s was synchronized from the former primary (this server was promoted)", t.slot)
	}
	switch {
	case len(f.standbySlots) == 0:
		fs = append(fs, Finding{Check: checkFailover, Severity: Warn,
			Message: "synchronized_standby_slots is empty: the walsender may send the relay transactions no standby has yet, and a promoted standby would then lack events that were published",
			Remedy:  "ALTER SYSTEM SET synchronized_standby_slots = '<physical slot of each standby>'; SELECT pg_reload_conf(); and, " + standbyNeeds})
	case len(f.missing) > 0 || len(f.inactive) > 0:
		fs = append(fs, Finding{Check: checkFailover, Severity: Warn,
			Message: fmt.Sprintf("synchronized_standby_slots = %s, but %s: logical decoding (and the relay) waits until those standbys stream again", strings.Join(f.standbySlots, ", "), standbyTrouble(f)),
			Remedy:  "start the standby, or remove its slot from synchronized_standby_slots; " + standbyNeeds})
	default:
		fs = append(fs, Finding{Check: checkFailover,
			Message: fmt.Sprintf("synchronized_standby_slots = %s, all streaming: published events and the janitor's marks reach those standbys before the slot passes them (%s)", strings.Join(f.standbySlots, ", "), standbyNeeds)})
	}
	return fs
}

func convertNote(convert bool, to string) string {
	if !convert {
		return ""
	}
	return fmt.Sprintf(" (the relay turns failover %s at its next session start, keeping the slot's position)", to)
}

func standbyTrouble(f failoverFacts) string {
	var parts []string
	if len(f.missing) > 0 {
		parts = append(parts, "no physical slot "+strings.Join(f.missing, ", "))
	}
	if len(f.inactive) > 0 {
		parts = append(parts, "no standby streams from "+strings.Join(f.inactive, ", "))
	}
	return strings.Join(parts, " and ")
}

// failoverCheck judges the slot's failover, on the slot's server.
func failoverCheck(ctx context.Context, s *session) []Finding {
	f, err := s.ss.failover(ctx, s.cfg.SlotFailover)
	if err != nil {
		return []Finding{failed(checkFailover, "read the server's failover settings", err)}
	}
	return classifyFailover(s.t, f)
}
