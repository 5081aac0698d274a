package config

import (
	"strings"
	"testing"
)

// TestSlotNameNeedsItsOwnMarker: slot names whose adoption marker could
// collide with another slot's are refused with a message that says why;
// the longest accepted name is 54 characters. CDCRELAY_STANDBY_RETRY is
// still accepted.
func TestSlotNameNeedsItsOwnMarker(t *testing.T) {
	base := map[string]string{"DATABASE_URL": "postgres://u:pw@db/app", "STANDBY_RETRY": "500ms"}
	with := func(slot string) map[string]string {
		m := map[string]string{"SLOT": slot}
		for k, v := range base {
			m[k] = v
		}
		return m
	}
	for _, ok := range []string{strings.Repeat("s", 54), "orders_outbox", "adopting"} {
		c, err := load(t, with(ok))
		if err != nil {
			t.Fatalf("SLOT=%s: %v", ok, err)
		}
		if c.StandbyRetry.String() != "500ms" {
			t.Fatalf("STANDBY_RETRY = %s", c.StandbyRetry)
		}
	}
	for slot, why := range map[string]string{
		strings.Repeat("s", 55): "at most 54",
		strings.Repeat("s", 63): "at most 54",
		"orders_adopting":       "adoption marker of another slot",
	} {
		_, err := load(t, with(slot))
		if err == nil || !strings.Contains(err.Error(), "CDCRELAY_SLOT:") || !strings.Contains(err.Error(), why) {
			t.Fatalf("SLOT=%s: %v; want a CDCRELAY_SLOT error saying %q", slot, err, why)
		}
	}
}
