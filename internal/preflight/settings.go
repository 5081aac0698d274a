package preflight

import (
	"context"
	"strconv"
)

// This file checks the server's settings: wal_level and the encoding,
// headroom for the relay's slot and WAL sender, and what bounds the WAL
// the slot retains and what commits wait for.

// setting is one pg_settings row.
type setting struct {
	value   string
	pending bool // pending_restart
}

// counts are the replication slots and WAL senders in use.
type counts struct {
	slots, senders int
	slotExists     bool // the relay's slot is among them
}

func loadSettings(ctx context.Context, s *session) {
	rows, err := s.db.Query(ctx, `
		SELECT name, setting, pending_restart FROM pg_settings
		WHERE name IN ('wal_level', 'max_replication_slots', 'max_wal_senders', 'max_slot_wal_keep_size', 'synchronous_standby_names', 'server_encoding')`)
	if err != nil {
		s.settingsErr = err
		return
	}
	s.settings = map[string]setting{}
	for rows.Next() {
		var name string
		var set setting
		if err := rows.Scan(&name, &set.value, &set.pending); err != nil {
			rows.Close()
			s.settingsErr = err
			return
		}
		s.settings[name] = set
	}
	s.settingsErr = rows.Err()
}

func loadCounts(ctx context.Context, s *session) {
	s.countsErr = s.db.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM pg_replication_slots), (SELECT count(*) FROM pg_stat_replication),
		       EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, s.t.slot).
		Scan(&s.counts.slots, &s.counts.senders, &s.counts.slotExists)
}

// serverCheck judges wal_level and the database encoding.
func serverCheck(_ context.Context, s *session) []Finding {
	if s.settingsErr != nil {
		return []Finding{failed(checkWALLevel, "read server settings", s.settingsErr)}
	}
	return []Finding{ClassifyWALLevel(s.settings["wal_level"].value, s.settings["wal_level"].pending), classifyEncoding(s.settings["server_encoding"].value)}
}

// headroomCheck judges whether a slot and a WAL sender are free for the
// relay (none needed for a slot that exists).
func headroomCheck(_ context.Context, s *session) []Finding {
	switch {
	case s.settingsErr != nil: // serverCheck said why
		return nil
	case s.countsErr != nil:
		return []Finding{failed(checkSlots, "count replication slots and WAL senders", s.countsErr)}
	}
	need := 1
	if s.counts.slotExists {
		need = 0
	}
	maxSlots, _ := strconv.Atoi(s.settings["max_replication_slots"].value)
	maxSenders, _ := strconv.Atoi(s.settings["max_wal_senders"].value)
	return []Finding{
		classifyHeadroom(checkSlots, maxSlots, s.counts.slots, need, "slot"),
		classifyHeadroom(checkSenders, maxSenders, s.counts.senders, 1, "replication connection")}
}

// sendersFree is how many more WAL senders the server admits; 0 when
// unknown.
func (s *session) sendersFree() int {
	if s.settingsErr != nil || s.countsErr != nil {
		return 0
	}
	maxSenders, _ := strconv.Atoi(s.settings["max_wal_senders"].value)
	return maxSenders - s.counts.senders
}

// walRetentionCheck judges max_slot_wal_keep_size and
// synchronous_standby_names.
func walRetentionCheck(_ context.Context, s *session) []Finding {
	if s.settingsErr != nil { // serverCheck said why
		return nil
	}
	keep, supported := s.settings["max_slot_wal_keep_size"]
	keepMB, _ := strconv.ParseInt(keep.value, 10, 64)
	return []Finding{classifyKeepSize(keepMB, supported), classifySyncStandby(s.settings["synchronous_standby_names"].value)}
}
