package preflight

import (
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
)

// TestClassifyOrigin: check says whether the marks are skipped undecoded,
// and names the grant that turns it on.
func TestClassifyOrigin(t *testing.T) {
	on := originFacts{setting: config.MarkOriginAuto, server: pgcaps.Caps{Version: 170010}, granted: true}
	for name, c := range map[string]struct {
		facts originFacts
		sev   Severity
		says  string
	}{
		"on":         {on, OK, "on: the janitor's marks"},
		"off":        {originFacts{setting: config.MarkOriginOff, server: pgcaps.Caps{Version: 170010}, granted: true}, OK, "CDCRELAY_MARK_ORIGIN=off"},
		"15":         {originFacts{setting: config.MarkOriginAuto, server: pgcaps.Caps{Version: 150019}}, OK, "needs PostgreSQL 16"},
		"no grant":   {originFacts{setting: config.MarkOriginAuto, server: pgcaps.Caps{Version: 160014}}, OK, "GRANT EXECUTE ON FUNCTION pg_replication_origin_oid(text), pg_replication_origin_create(text), pg_replication_origin_session_setup(text) TO relay;"},
		"subscriber": {originFacts{setting: config.MarkOriginAuto, server: pgcaps.Caps{Version: 170010}, granted: true, others: []string{"pg_16400"}}, Warn, "not a relay's (pg_16400)"},
	} {
		f := classifyOrigin("relay", c.facts)
		if f.Severity != c.sev || !strings.Contains(f.Message, c.says) || (f.Severity != OK && f.Remedy == "") {
			t.Errorf("%s: %v %q (remedy %q); want %v saying %q", name, f.Severity, f.Message, f.Remedy, c.sev, c.says)
		}
	}
}
