package preflight

import (
	"slices"
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// TestRelayApplicationNames: the names a relay's walsender may carry are
// the default and those of both URLs, each once, never an empty one.
func TestRelayApplicationNames(t *testing.T) {
	for _, c := range []struct {
		db, repl string
		want     []string
	}{
		{"postgres://u@p/app", "", []string{"cdcrelay"}},
		{"postgres://u@p/app?application_name=orders", "", []string{"cdcrelay", "orders"}},
		{"postgres://u@p/app?application_name=orders", "postgres://u@s/app?application_name=orders_sb", []string{"cdcrelay", "orders", "orders_sb"}},
		{"postgres://u@p/app?application_name=orders", "postgres://u@s/app?application_name=orders", []string{"cdcrelay", "orders"}},
		{"postgres://u@p/app?application_name=", "postgres://u@s/app?application_name=orders_sb", []string{"cdcrelay", "orders_sb"}},
	} {
		if got := relayApplicationNames(config.Config{DatabaseURL: c.db, ReplicationURL: c.repl}); !slices.Equal(got, c.want) {
			t.Errorf("%s, %s: %q, want %q", c.db, c.repl, got, c.want)
		}
	}
}

// TestClassifyOtherSlotsOnStandby: a slot on the replication server is
// judged as one on the primary is, named as being there, and the remedy
// says to drop it there; a relay streaming there under the replication
// URL's application_name is a relay; with no other slot, the finding says
// both servers were looked at.
func TestClassifyOtherSlotsOnStandby(t *testing.T) {
	tg := target{schema: "public", table: "event_outbox", database: "app", slot: "a"}
	apps := []string{"cdcrelay", "orders_sb"}
	fs := classifyOtherSlots(tg, apps, true, []otherSlot{
		{name: "b", plugin: "pgoutput", onStandby: true, active: true, app: "orders_sb"},
		{name: "c", plugin: "pgoutput", active: true, app: "cdcrelay"},
		{name: "d", plugin: "pgoutput", onStandby: true},
		{name: "e", plugin: "pgoutput", onStandby: true, active: true, app: "a_subscriber"},
	})
	want := []struct {
		prefix string
		sev    Severity
		remedy string // "" when none
	}{
		{"slot b on the replication server (plugin pgoutput, active", Warn, "SELECT pg_drop_replication_slot('b'); on the replication server, CDCRELAY_REPLICATION_URL)"},
		{"slot c (plugin pgoutput, active", Warn, "SELECT pg_drop_replication_slot('c');)"},
		{"slot d on the replication server (plugin pgoutput, inactive)", Warn, "SELECT pg_drop_replication_slot('d'); on the replication server, CDCRELAY_REPLICATION_URL"},
		{"slot e on the replication server (plugin pgoutput, active", OK, ""},
	}
	if len(fs) != len(want) {
		t.Fatalf("%d findings, want %d: %+v", len(fs), len(want), fs)
	}
	for i, w := range want {
		f := fs[i]
		if f.Check != checkOtherSlots || !strings.HasPrefix(f.Message, w.prefix) || f.Severity != w.sev || !strings.Contains(f.Remedy, w.remedy) || (w.remedy == "") != (f.Remedy == "") {
			t.Errorf("finding %d: %v %q remedy %q; want %v, a message starting %q, a remedy with %q", i, f.Severity, f.Message, f.Remedy, w.sev, w.prefix, w.remedy)
		}
	}

	for standby, want := range map[bool]string{
		false: "no other logical slot in database app",
		true:  "no other logical slot in database app, on the primary or on the replication server",
	} {
		if fs := classifyOtherSlots(tg, apps, standby, nil); len(fs) != 1 || fs[0].Message != want || fs[0].Severity != OK {
			t.Errorf("no other slot, standby %v: %+v, want one OK finding %q", standby, fs, want)
		}
	}
}
