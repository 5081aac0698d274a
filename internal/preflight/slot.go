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
// yet, what its creation waits for.
func slotCheck(_ context.Context, s *session) []Finding {
	if s.slotErr != nil {
		return []Finding{failed(checkSlot, "read replication slot "+s.t.slot, s.slotErr)}
	}
	sl := s.slot
	sl.publicationMissing = !s.pub.Exists
	sl.noReplication = s.roleErr.ok() && !s.role.super && !s.role.replication && !s.role.rdsReplication
	return []Finding{classifySlot(s.t, sl)}
}
