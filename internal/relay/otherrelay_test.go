package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/preflight"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationSecondRelayOnDatabase: two relays with slots a and b on
// one outbox (two releases, a copied values file) publish every event
// twice. Neither is silent: cdcrelay check for a names slot b as another
// relay, an error whose remedy reuses slot b and never drops it, and each running relay's monitor logs the other's slot and
// exports cdcrelay_other_relay_slots = 1.
func TestIntegrationSecondRelayOnDatabase(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	fast := func(slot string) map[string]string {
		return map[string]string{"SLOT": slot, "MONITOR_INTERVAL": "200ms"}
	}
	a := e.startRelay(fast("a"))
	b := e.startRelay(fast("b"))
	a.waitStreaming(t)
	b.waitStreaming(t)

	fs := preflight.Run(context.Background(), e.config(fast("a")), preflight.Options{Timeout: 10 * time.Second})
	found := false
	for _, f := range fs {
		if f.Check == "other_slots" && f.Severity == preflight.Error && strings.HasPrefix(f.Message, "slot b (plugin pgoutput, active") &&
			strings.Contains(f.Message, "another relay streams public.event_outbox from its own slot; this configuration would publish every event twice") &&
			strings.Contains(f.Remedy, "reuse its slot: CDCRELAY_SLOT=b (") && !strings.Contains(f.Remedy, "pg_drop_replication_slot") {
			found = true
		}
	}
	if !found {
		var out strings.Builder
		preflight.Write(&out, fs)
		t.Fatalf("check for slot a does not report slot b as an error (reuse it, never drop it):\n%s", out.String())
	}

	for _, r := range []struct {
		run         *running
		self, other string
	}{{a, "a", "b"}, {b, "b", "a"}} {
		pollUntil(t, time.Minute, "relay "+r.self+" logs slot "+r.other, func() bool {
			logs := r.run.logs.String()
			return strings.Contains(logs, "another relay streams this database") && strings.Contains(logs, "other_slots="+r.other+" ")
		})
		if got := registrySeries(t, r.run.reg)[`cdcrelay_other_relay_slots{slot="`+r.self+`"}`]; got != 1 {
			t.Fatalf("relay %s: cdcrelay_other_relay_slots = %v, want 1", r.self, got)
		}
	}
}
