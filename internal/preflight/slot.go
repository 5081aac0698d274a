package preflight

import (
	"context"

	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// This file checks the relay's slot, on the server that holds it.

func loadSlot(ctx context.Context, s *session) {
	s.slot.Info, s.slotErr = slot.ReadSlot(ctx, s.ss.db, s.t.slot)
}

// slotCheck judges the slot as the relay does and, when it does not exist
// yet, what its creation waits for. An active slot is looked at further:
// a holder that is not a relay is an error of its own (ForeignHolder),
// where a relay holding it is what a hot standby waits for.
func slotCheck(ctx context.Context, s *session) []Finding {
	if s.slotErr != nil {
		return []Finding{failed(checkSlot, "read replication slot "+s.t.slot, s.slotErr)}
	}
	sl := s.slot
	sl.publicationMissing = !s.pub.Exists
	sl.noReplication = s.roleErr.ok() && !s.role.super && !s.role.replication && !s.role.rdsReplication
	f := classifySlot(s.t, sl)
	if !sl.Active || sl.Lost {
		return []Finding{f}
	}
	h, held, err := slot.ReadHolder(ctx, s.ss.db, s.t.slot)
	switch {
	case err != nil:
		return []Finding{f, failed(checkSlot, "read the holder of replication slot "+s.t.slot, err)}
	case !held || IsRelay(s.cfg, h):
		return []Finding{f}
	case f.Severity == Error:
		return []Finding{f, ForeignHolder(s.t.slot, h)}
	}
	return []Finding{ForeignHolder(s.t.slot, h)}
}
