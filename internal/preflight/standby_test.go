package preflight

import (
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
)

// TestClassifyStandby: what check says about CDCRELAY_REPLICATION_URL's
// server.
func TestClassifyStandby(t *testing.T) {
	base := standbyFacts{server: pgcaps.Caps{Version: 170010, InRecovery: true}, systemID: "7", primarySystemID: "7",
		walLevel: "logical", feedback: "on", primarySlot: "sb1", physicalExists: true, physicalActive: true, snapshotExists: true, canSnapshot: true}
	with := func(f func(*standbyFacts)) standbyFacts { c := base; f(&c); return c }
	for name, c := range map[string]struct {
		facts standbyFacts
		worst Severity
		says  string
	}{
		"ready":            {base, OK, "is a standby of the primary"},
		"other system":     {with(func(f *standbyFacts) { f.systemID = "8" }), Error, "must be a physical standby"},
		"promoted":         {with(func(f *standbyFacts) { f.server.InRecovery = false }), Warn, "is not a standby"},
		"15":               {with(func(f *standbyFacts) { f.server.Version = 150019 }), Error, "needs PostgreSQL 16"},
		"replica wal":      {with(func(f *standbyFacts) { f.walLevel = "replica" }), Error, "wal_level = logical"},
		"no feedback":      {with(func(f *standbyFacts) { f.feedback = "off" }), Error, "hot_standby_feedback = on"},
		"no physical slot": {with(func(f *standbyFacts) { f.primarySlot = "" }), Warn, "no primary_slot_name"},
		"not streaming":    {with(func(f *standbyFacts) { f.physicalActive = false }), Warn, "is inactive"},
		"slot gone":        {with(func(f *standbyFacts) { f.physicalExists, f.physicalActive = false, false }), Warn, "is missing"},
		"no grant":         {with(func(f *standbyFacts) { f.canSnapshot = false }), Warn, "GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO relay"},
	} {
		fs := classifyStandby("postgres://standby", "relay", c.facts)
		worst, text := OK, ""
		for _, f := range fs {
			worst = max(worst, f.Severity)
			text += f.Message + " | " + f.Remedy + "\n"
			if f.Severity != OK && f.Remedy == "" {
				t.Errorf("%s: %v finding without a remedy: %s", name, f.Severity, f.Message)
			}
		}
		if worst != c.worst || !strings.Contains(text, c.says) {
			t.Errorf("%s: worst %v, want %v; findings:\n%s(want them to say %q)", name, worst, c.worst, text, c.says)
		}
	}
}
