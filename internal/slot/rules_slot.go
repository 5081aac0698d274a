package slot

import "fmt"

// SlotProblems judges the slot the relay streams from (see rules.go): it
// must be a permanent logical pgoutput slot of this database, and not
// invalidated unless CDCRELAY_SLOT_LOST=recreate; one about to be
// invalidated is a warning. A slot that does not exist yet is no problem:
// the relay creates it.
func SlotProblems(s Scope, f Info) []Problem {
	drop := fmt.Sprintf("SELECT pg_drop_replication_slot('%s'); (when no relay uses it)", s.Slot)
	mismatch := func(msg, remedy string) []Problem {
		return []Problem{{Fatal: true, Err: ErrSlotMismatch, Message: msg, Remedy: remedy}}
	}
	switch {
	case !f.Exists:
		return nil
	case f.Type != "logical" || f.Plugin != "pgoutput":
		kind := f.Type + " slot"
		if f.Plugin != "" {
			kind += " with plugin " + f.Plugin
		}
		return mismatch(fmt.Sprintf("slot %s is a %s; the relay needs a logical pgoutput slot", s.Slot, kind),
			fmt.Sprintf("set CDCRELAY_SLOT to an unused name, or drop the slot: %s", drop))
	case f.Database != f.CurrentDatabase:
		return mismatch(fmt.Sprintf("slot %s belongs to database %s, not %s", s.Slot, f.Database, f.CurrentDatabase),
			"set CDCRELAY_SLOT to a name of its own for this database (slot names are cluster-wide)")
	case f.Lost && s.RecreateLost:
		// The relay drops and recreates it: it works, with a backfill and
		// duplicates, so a warning.
		return []Problem{{Err: ErrSlotLost,
			Message: fmt.Sprintf("slot %s is invalidated (%s); with CDCRELAY_SLOT_LOST=recreate the relay drops it, creates a new one and publishes every row with published_at IS NULL from its snapshot (consumers see duplicates)", s.Slot, lostWhy(f)),
			Remedy:  "find why the relay fell so far behind (docs/runbook.md), and raise max_slot_wal_keep_size if outages that long must be ridden out"}}
	case f.Lost:
		return []Problem{{Fatal: true, Err: ErrSlotLost,
			Message: fmt.Sprintf("slot %s is invalidated (%s), and CDCRELAY_SLOT_LOST=stop makes the relay stop: events committed after its position may never have been published", s.Slot, lostWhy(f)),
			Remedy:  fmt.Sprintf("drop it and start the relay, which recreates it and publishes rows with published_at IS NULL from the new slot's snapshot: %s; or set CDCRELAY_SLOT_LOST=recreate", drop)}}
	case f.Temporary:
		return mismatch(fmt.Sprintf("slot %s is temporary: it disappears with its session and the relay's position with it", s.Slot),
			"set CDCRELAY_SLOT to an unused name; the relay creates a permanent slot")
	case f.WALStatus == "unreserved":
		return []Problem{{Err: ErrSlotLost,
			Message: f.Summary(s.Slot) + ": it is about to pass max_slot_wal_keep_size and be invalidated",
			Remedy:  "get the relay streaming now (see its logs), or raise max_slot_wal_keep_size"}}
	}
	return nil
}

// lostWhy says why PostgreSQL invalidated the slot.
func lostWhy(f Info) string {
	if f.WALStatus == "lost" {
		return "wal_status lost): WAL it still needed was removed (max_slot_wal_keep_size"
	}
	return f.Invalidation + "): PostgreSQL can no longer decode from it (WAL or catalog rows it needed were removed"
}

// Summary says what a usable slot named name is: plugin, database, and,
// where the server says, its wal_status and the WAL it retains.
func (f Info) Summary(name string) string {
	msg := fmt.Sprintf("slot %s exists (pgoutput, database %s", name, f.Database)
	if f.WALStatus != "" {
		msg += ", wal_status " + f.WALStatus
	}
	if f.Retained != "" {
		msg += ", retaining " + f.Retained + " of WAL"
	}
	return msg + ")"
}
