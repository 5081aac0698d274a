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

// TestMarkerNamesCollisionFree: slot names sharing a long prefix get
// markers of their own, names that could not are refused, and no accepted
// name is another accepted name's marker.
func TestMarkerNamesCollisionFree(t *testing.T) {
	prefix := strings.Repeat("a", 53)
	accepted := []string{"cdcrelay_outbox", "a", prefix, prefix + "b", prefix + "c", strings.Repeat("z", MaxSlotNameLen), "x_adoptin", "adopting", "_adopting_x"}
	refused := []string{
		prefix + "bc",             // 55: the old truncation gave it prefix+"b"'s marker
		strings.Repeat("a", 63),   // the longest legal slot name
		"orders" + AdoptionSuffix, // another slot's marker
		strings.Repeat("q", 45) + AdoptionSuffix,
	}
	markers := map[string]string{}
	for _, name := range accepted {
		if err := CheckSlotName(name); err != nil {
			t.Fatalf("CheckSlotName(%q): %v", name, err)
		}
		m := AdoptionMarkerName(name)
		if len(m) > 63 {
			t.Fatalf("marker of %q is %d characters", name, len(m))
		}
		if other, ok := markers[m]; ok {
			t.Fatalf("%q and %q share the marker %q", name, other, m)
		}
		markers[m] = name
		if CheckSlotName(m) == nil {
			t.Fatalf("the marker %q of %q is itself an accepted slot name", m, name)
		}
	}
	for _, name := range refused {
		err := CheckSlotName(name)
		if err == nil {
			t.Fatalf("CheckSlotName(%q) accepted a name whose marker could collide", name)
		}
		if !strings.Contains(err.Error(), name) {
			t.Fatalf("CheckSlotName(%q): %v does not name the slot", name, err)
		}
	}
}
