package adoption

import (
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// TestMarkerNamesCollisionFree: slot names sharing a long prefix get
// markers of their own, names that could not are refused, and no accepted
// name is another accepted name's marker.
func TestMarkerNamesCollisionFree(t *testing.T) {
	prefix := strings.Repeat("a", 53)
	accepted := []string{"cdcrelay_outbox", "a", prefix, prefix + "b", prefix + "c", strings.Repeat("z", config.MaxSlotNameLen), "x_adoptin", "adopting", "_adopting_x"}
	refused := []string{
		prefix + "bc",                    // 55: the old truncation gave it prefix+"b"'s marker
		strings.Repeat("a", 63),          // the longest legal slot name
		"orders" + config.AdoptionSuffix, // another slot's marker
		strings.Repeat("q", 45) + config.AdoptionSuffix,
	}
	markers := map[string]string{}
	for _, name := range accepted {
		if err := config.CheckSlotName(name); err != nil {
			t.Fatalf("CheckSlotName(%q): %v", name, err)
		}
		m := MarkerName(name)
		if len(m) > 63 {
			t.Fatalf("marker of %q is %d characters", name, len(m))
		}
		if other, ok := markers[m]; ok {
			t.Fatalf("%q and %q share the marker %q", name, other, m)
		}
		markers[m] = name
		if config.CheckSlotName(m) == nil {
			t.Fatalf("the marker %q of %q is itself an accepted slot name", m, name)
		}
	}
	for _, name := range refused {
		err := config.CheckSlotName(name)
		if err == nil {
			t.Fatalf("CheckSlotName(%q) accepted a name whose marker could collide", name)
		}
		if !strings.Contains(err.Error(), name) {
			t.Fatalf("CheckSlotName(%q): %v does not name the slot", name, err)
		}
	}
}
