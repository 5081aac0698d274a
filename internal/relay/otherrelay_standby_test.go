//go:build pgmatrix

package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/preflight"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// This file needs PostgreSQL 16 or later (logical decoding on a standby):
// make test-pg-matrix runs it (build tag pgmatrix).

// TestIntegrationSecondRelayOnStandby: relays a and b stream one outbox
// from slots on the standby of CDCRELAY_REPLICATION_URL, relay c from a
// slot on the primary: every event goes out three times. cdcrelay check
// for a names slot b on the replication server and slot c on the primary
// as other relays (errors whose remedies reuse each slot where it is and
// never drop it), and the running a and b each log the other two (saying
// which is on the standby) and export cdcrelay_other_relay_slots = 2.
// (c, whose configuration names no standby, cannot see a and b: their
// walsenders run on the standby.)
func TestIntegrationSecondRelayOnStandby(t *testing.T) {
	w := newStandbyWorld(t, testenv.StandbyOptions{Slot: "sb1"})
	fast := func(slot string) map[string]string {
		return map[string]string{"SLOT": slot, "MONITOR_INTERVAL": "200ms"}
	}
	a, b := w.start(t, fast("a")), w.start(t, fast("b"))
	c := relaytest.Start(t, relaytest.Config(t, relaytest.Vars(w.relayURL, w.amqpURL, w.exchange, fast("c"))),
		relaytest.InProcessOptions{LogTo: testWriter{t}})
	t.Cleanup(func() { _ = c.Stop() })
	c.WaitStreaming(t)

	cfg := relaytest.Config(t, relaytest.Vars(w.relayURL, w.amqpURL, w.exchange, map[string]string{"SLOT": "a", "REPLICATION_URL": w.replURL}))
	fs := preflight.Run(context.Background(), cfg, preflight.Options{Timeout: 10 * time.Second})
	var out strings.Builder
	preflight.Write(&out, fs)
	warned := func(prefix, remedy string) bool {
		for _, f := range fs {
			if f.Check == "other_slots" && f.Severity == preflight.Error && strings.HasPrefix(f.Message, prefix) &&
				strings.Contains(f.Message, "another relay") && strings.Contains(f.Remedy, remedy) && !strings.Contains(f.Remedy, "pg_drop_replication_slot") {
				return true
			}
		}
		return false
	}
	if !warned("slot b on the replication server (plugin pgoutput, active", "CDCRELAY_SLOT=b, with CDCRELAY_REPLICATION_URL on the replication server it is on") {
		t.Errorf("check for slot a does not name slot b on the standby as another relay:\n%s", out.String())
	}
	if !warned("slot c (plugin pgoutput, active", "CDCRELAY_SLOT=c, streamed from the primary: without CDCRELAY_REPLICATION_URL") {
		t.Errorf("check for slot a does not name slot c on the primary as another relay:\n%s", out.String())
	}
	t.Logf("check for slot a:\n%s", out.String())

	for _, r := range []struct {
		run                *relaytest.InProcess
		self, others, peer string
	}{{a, "a", "b,c", "b"}, {b, "b", "a,c", "a"}} {
		pollUntil(t, time.Minute, "relay "+r.self+" logs slots "+r.others, func() bool {
			logs := r.run.Logs.String()
			return strings.Contains(logs, "another relay streams this database") &&
				strings.Contains(logs, "other_slots="+r.others+" on_replication_server="+r.peer+" ")
		})
		if got := registrySeries(t, r.run.Reg)[`cdcrelay_other_relay_slots{slot="`+r.self+`"}`]; got != 2 {
			t.Fatalf("relay %s: cdcrelay_other_relay_slots = %v, want 2", r.self, got)
		}
	}
}
