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

// TestServer: failover slots need 17+ and a primary; versions print as
// PostgreSQL names them.
func TestServer(t *testing.T) {
	for _, c := range []struct {
		s    Server
		can  bool
		text string
	}{
		{Server{Version: 170010}, true, "PostgreSQL 17.10 (primary)"},
		{Server{Version: 180004, InRecovery: true}, false, "PostgreSQL 18.4 (standby)"},
		{Server{Version: 160014}, false, "PostgreSQL 16.14 (primary)"},
		{Server{Version: 130023}, false, "PostgreSQL 13.23 (primary)"},
		{Server{Version: 90624}, false, "PostgreSQL 9.6.24 (primary)"},
	} {
		if c.s.CanFailover() != c.can || c.s.String() != c.text {
			t.Errorf("%+v: CanFailover %v, String %q; want %v, %q", c.s, c.s.CanFailover(), c.s.String(), c.can, c.text)
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
