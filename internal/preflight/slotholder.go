package preflight

import (
	"fmt"
	"slices"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// This file tells a relay holding the slot from a process that is not
// one (pg_recvlogical, a subscription, another tool): check reports the
// latter as an error, and the relay reports it the same way, since such a
// process confirms the slot's position past events the relay then never
// streams.

// IsRelay reports whether the slot's holder names itself as a relay of
// cfg's: a relay of this version streaming (it holds the slot lock), one
// whose session is ending, or one of an older version during a rolling
// upgrade. Only the name tells them apart from a foreign client: the slot
// lock is held by each relay for a moment at every retry, whoever holds
// the slot.
func IsRelay(cfg config.Config, h slot.SlotHolder) bool {
	return slices.Contains(relayApplicationNames(cfg), h.ApplicationName)
}

// ForeignHolder is the finding for a slot held by a process that is not a
// relay: check reports it as an error, the relay at ERROR, on /readyz and
// as cdcrelay_status{reason="slot_foreign"}.
func ForeignHolder(slotName string, h slot.SlotHolder) Finding {
	who := fmt.Sprintf("pid %d (application_name %q", h.PID, h.ApplicationName)
	if h.ClientAddr != "" {
		who += ", client " + h.ClientAddr
	}
	who += ")"
	return Finding{Check: checkSlot, Severity: Error,
		Message: fmt.Sprintf("slot %s is held by %s, which is not a relay: it streams the slot and confirms its position, so the relay cannot stream, and the outbox rows whose inserts it confirms past are never streamed to the broker (they keep published_at NULL)",
			slotName, who),
		Remedy: fmt.Sprintf("stop that process (pg_recvlogical, a subscription: ALTER SUBSCRIPTION … DISABLE, another tool), or end its connection: SELECT pg_terminate_backend(%d); if it confirmed past rows, recreate the slot so that they are published (docs/runbook.md#cdcrelayslotforeignholder)",
			h.PID)}
}
