package janitor

import (
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
)

// TestOriginNotice: the start-up line points at a remedy only where one
// applies (PostgreSQL 16 or later, a role without the grants); before 16
// it says there is nothing to change.
func TestOriginNotice(t *testing.T) {
	for _, tc := range []struct {
		name    string
		on      bool
		version int
		want    string
		remedy  bool
	}{
		{"tagged", true, 0, "marks carry a replication origin", false},
		{"PostgreSQL 15", false, 150020, "PostgreSQL before 16 cannot skip them by origin", false},
		{"PostgreSQL 13", false, 130000, "nothing to change", false},
		{"PostgreSQL 16 without the grants", false, 160004, "the role may not use origins", true},
		{"PostgreSQL 18 without the grants", false, 180000, "the role may not use origins", true},
	} {
		msg, attrs := originNotice(tc.on, pgcaps.Caps{Version: tc.version}, "cdcrelay_x")
		hasRemedy := len(attrs) == 2 && attrs[0] == "remedy" && attrs[1] == "docs/least-privilege.md"
		if !strings.Contains(msg, tc.want) || hasRemedy != tc.remedy {
			t.Errorf("%s: %q %v; want %q, remedy %v", tc.name, msg, attrs, tc.want, tc.remedy)
		}
		if !tc.remedy && strings.Contains(msg, "grant") {
			t.Errorf("%s: %q blames a grant", tc.name, msg)
		}
	}
}
