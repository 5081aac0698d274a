//go:build pgmatrix

package monitor

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationMonitorOtherRelayOnStandby: with the slot on a standby
// (SlotDatabaseURL), another relay's slot on that standby is counted and
// named, as one on the primary is; with a third on the primary both are,
// and as each goes the gauge follows. A subscriber's slot on the standby
// (another application_name) does not count. PostgreSQL 16+.
func TestIntegrationMonitorOtherRelayOnStandby(t *testing.T) {
	testenv.RequireMajor(t, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := setUpSlotOnStandby(ctx, t)
	for _, name := range []string{"b", "subscriber_slot"} {
		createSlotOnStandby(ctx, t, e.primaryDB, e.standbyDB, name)
	}
	r := start(t, Options{
		DatabaseURL: e.primary.URL("app"), SlotDatabaseURL: e.standby.URL("app"),
		Outbox: config.Outbox{Schema: "public", Table: "event_outbox", Slot: "s1"},
	})
	key := "cdcrelay_other_relay_slots{slot=s1}"
	waitFor(t, "the first refresh", func() bool { v, ok := r.series(t)[key]; return ok && v == 0 })

	stream(t, e.standby.URL("app"), "subscriber_slot", "a_subscriber", false)
	stopB := stream(t, e.standby.URL("app"), "b", "cdcrelay", false)
	waitFor(t, "the other relay on the standby counted", func() bool { return r.series(t)[key] == 1 })
	waitFor(t, "the other relay on the standby logged", func() bool {
		return strings.Contains(r.logs.String(), "other_slots=b ") && strings.Contains(r.logs.String(), "on_replication_server=b")
	})

	stopC := streamSlot(t, e.primary.URL("app"), "c", "cdcrelay")
	waitFor(t, "the relays on both servers counted", func() bool { return r.series(t)[key] == 2 })
	waitFor(t, "the relays on both servers logged", func() bool { return strings.Contains(r.logs.String(), "other_slots=b,c ") })
	if strings.Contains(r.logs.String(), "subscriber_slot") {
		t.Fatalf("a subscriber's slot on the standby was reported as a relay:\n%s", r.logs.String())
	}

	stopB()
	waitFor(t, "the standby's relay gone", func() bool { return r.series(t)[key] == 1 })
	stopC()
	waitFor(t, "both gone", func() bool { return r.series(t)[key] == 0 })
	waitFor(t, "the departure logged", func() bool {
		return strings.Contains(r.logs.String(), "no other relay streams this database any more")
	})
	if n := testutilCounter(t, r.reg, "cdcrelay_monitor_errors_total"); n != 0 {
		t.Fatalf("%v monitor errors:\n%s", n, r.logs.String())
	}
}
