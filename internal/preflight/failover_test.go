package preflight

import (
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
)

// TestClassifyFailover: what check says about failover slots for each
// server, setting and state of the standbys.
func TestClassifyFailover(t *testing.T) {
	tg := target{slot: "cdcrelay"}
	p17 := pgcaps.Caps{Version: 170010}
	base := failoverFacts{server: p17, setting: config.SlotFailoverAuto, slotExists: true, slotFailover: true, standbySlots: []string{"sb1"}}
	with := func(f func(*failoverFacts)) failoverFacts { c := base; f(&c); return c }
	for name, c := range map[string]struct {
		facts failoverFacts
		worst Severity
		says  string
	}{
		"streaming standby": {base, OK, "all streaming"},
		"no standby slots":  {with(func(f *failoverFacts) { f.standbySlots = nil }), Warn, "synchronized_standby_slots is empty"},
		"standby down":      {with(func(f *failoverFacts) { f.inactive = []string{"sb1"} }), Warn, "no standby streams from sb1"},
		"slot missing":      {with(func(f *failoverFacts) { f.missing = []string{"sb1"} }), Warn, "no physical slot sb1"},
		"to convert":        {with(func(f *failoverFacts) { f.slotFailover = false }), OK, "turns failover on at its next session start"},
		"promoted":          {with(func(f *failoverFacts) { f.slotSynced = true }), OK, "synchronized from the former primary"},
		"16 auto":           {with(func(f *failoverFacts) { f.server.Version = 160014 }), OK, "need a PostgreSQL 17 or later primary"},
		"16 on":             {with(func(f *failoverFacts) { f.server.Version, f.setting = 160014, config.SlotFailoverOn }), Error, "relay exits at start"},
		"standby on":        {with(func(f *failoverFacts) { f.server.InRecovery, f.setting = true, config.SlotFailoverOn }), Error, "(standby)"},
		"off":               {with(func(f *failoverFacts) { f.setting = config.SlotFailoverOff }), OK, "turns failover off"},
	} {
		fs := classifyFailover(tg, c.facts)
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
