package slot

import (
	"slices"
	"testing"
)

// TestInvalidation: every way a PostgreSQL version reports an unusable
// slot counts, the most specific reason first.
func TestInvalidation(t *testing.T) {
	for _, c := range []struct {
		walStatus   string
		conflicting bool
		reason      string
		want        string
	}{
		{"reserved", false, "", ""},
		{"lost", false, "", "wal_status lost"},
		{"reserved", true, "", "conflicting"},                 // 16 on a standby
		{"lost", true, "wal_removed", "wal_removed"},          // 17+
		{"reserved", true, "rows_removed", "rows_removed"},    // 17+, recovery conflict
		{"unreserved", false, "idle_timeout", "idle_timeout"}, // 18
		{"extended", false, "wal_level_insufficient", "wal_level_insufficient"},
	} {
		if got := invalidation(c.walStatus, c.conflicting, c.reason); got != c.want {
			t.Errorf("invalidation(%q, %v, %q) = %q, want %q", c.walStatus, c.conflicting, c.reason, got, c.want)
		}
	}
}

// TestStandbySlots: synchronized_standby_slots is split as PostgreSQL
// splits identifier lists: unquoted names fold to lower case.
func TestStandbySlots(t *testing.T) {
	for setting, want := range map[string][]string{
		"":                     nil,
		"sb1":                  {"sb1"},
		" SB1 , sb2,":          {"sb1", "sb2"},
		`"Mixed", "a""b", c_3`: {"Mixed", `a"b`, "c_3"},
	} {
		if got := StandbySlots(setting); !slices.Equal(got, want) {
			t.Errorf("StandbySlots(%q) = %q, want %q", setting, got, want)
		}
	}
}
