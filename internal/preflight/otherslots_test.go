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
// says to reuse it there (or, for one inactive, to drop it there once
// nothing will stream it); a relay streaming there under the replication
// URL's application_name is a relay; with no other slot, the finding says
// both servers were looked at.
func TestClassifyOtherSlotsOnStandby(t *testing.T) {
	tg := target{schema: "public", table: "event_outbox", database: "app", slot: "a", role: "relay"}
	apps := []string{"cdcrelay", "orders_sb"}
	fs := classifyOtherSlots(tg, apps, true, []otherSlot{
		{name: "b", plugin: "pgoutput", onStandby: true, active: true, app: "orders_sb"},
		{name: "c", plugin: "pgoutput", active: true, app: "cdcrelay"},
		{name: "d", plugin: "pgoutput", onStandby: true},
		{name: "e", plugin: "pgoutput", onStandby: true, active: true, app: "a_subscriber"},
		{name: "f", plugin: "pgoutput", onStandby: true, active: true, app: "orders_sb", pubs: []string{"cdcrelay_outbox"}, coversOutbox: true},
	})
	want := []struct {
		prefix string
		sev    Severity
		remedy string // "" when none
	}{
		{"slot b on the replication server (plugin pgoutput, active", Warn, "CDCRELAY_SLOT=b, with CDCRELAY_REPLICATION_URL on the replication server it is on"},
		{"slot c (plugin pgoutput, active", Warn, "CDCRELAY_SLOT=c, streamed from the primary: without CDCRELAY_REPLICATION_URL"},
		{"slot d on the replication server (plugin pgoutput, inactive)", Warn, "SELECT pg_drop_replication_slot('d'); on the replication server, CDCRELAY_REPLICATION_URL"},
		{"slot e on the replication server (plugin pgoutput, active", OK, ""},
		{"slot f on the replication server (plugin pgoutput, active", Error, "CDCRELAY_SLOT=f, with CDCRELAY_REPLICATION_URL on the replication server it is on"},
	}
	if len(fs) != len(want) {
		t.Fatalf("%d findings, want %d: %+v", len(fs), len(want), fs)
	}
	for i, w := range want {
		f := fs[i]
		if f.Check != checkOtherSlots || !strings.HasPrefix(f.Message, w.prefix) || f.Severity != w.sev || !strings.Contains(f.Remedy, w.remedy) || (w.remedy == "") != (f.Remedy == "") {
			t.Errorf("finding %d: %v %q remedy %q; want %v, a message starting %q, a remedy with %q", i, f.Severity, f.Message, f.Remedy, w.sev, w.prefix, w.remedy)
		}
		// A slot something streams is never to be dropped: it may be the
		// production relay's.
		if i != 2 && strings.Contains(f.Remedy, "pg_drop_replication_slot") {
			t.Errorf("finding %d: remedy %q says to drop a streamed slot", i, f.Remedy)
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

// TestClassifySecondRelayOnOutbox: values copied from a running relay
// (another slot streamed by a relay-named connection whose publication
// covers the outbox) is an Error saying every event would go out twice,
// whose remedy reuses that relay's slot or fixes the copied values and
// never drops the other relay's slot; the same publication streamed by a
// connection not named like a relay (a replica?) and a relay-named one
// whose publication the role cannot see are warnings.
func TestClassifySecondRelayOnOutbox(t *testing.T) {
	tg := target{schema: "public", table: "event_outbox", database: "app", slot: "cdcrelay_orders_v2", role: "relay"}
	fs := classifyOtherSlots(tg, []string{"cdcrelay"}, false, []otherSlot{
		{name: "cdcrelay_orders", plugin: "pgoutput", active: true, app: "cdcrelay", pubs: []string{"cdcrelay_outbox"}, coversOutbox: true},
		{name: "replica", plugin: "pgoutput", active: true, app: "reporting", pubs: []string{"everything"}, coversOutbox: true},
		{name: "hidden", plugin: "pgoutput", active: true, app: "cdcrelay"},
	})
	if len(fs) != 3 {
		t.Fatalf("%d findings, want 3: %+v", len(fs), fs)
	}
	f := fs[0]
	if f.Severity != Error || !strings.Contains(f.Message, "another relay streams public.event_outbox from its own slot; this configuration would publish every event twice") {
		t.Errorf("second relay: %v %q", f.Severity, f.Message)
	}
	for _, want := range []string{"stop the other relay and reuse its slot: CDCRELAY_SLOT=cdcrelay_orders (", "fix CDCRELAY_SLOT, CDCRELAY_PUBLICATION and CDCRELAY_TABLE", "Keep slot cdcrelay_orders"} {
		if !strings.Contains(f.Remedy, want) {
			t.Errorf("second relay: remedy %q lacks %q", f.Remedy, want)
		}
	}
	if f := fs[1]; f.Severity != Warn || !strings.Contains(f.Message, "a logical replica of the table is fine") || !strings.Contains(f.Remedy, "CDCRELAY_SLOT=replica") {
		t.Errorf("a replica of the table: %v %q remedy %q", f.Severity, f.Message, f.Remedy)
	}
	if f := fs[2]; f.Severity != Warn || !strings.Contains(f.Message, "its publication is not visible to role relay") {
		t.Errorf("a relay whose publication is hidden: %v %q", f.Severity, f.Message)
	}
	for i, f := range fs {
		if strings.Contains(f.Remedy, "pg_drop_replication_slot") {
			t.Errorf("finding %d: remedy %q says to drop a streamed slot", i, f.Remedy)
		}
	}
}
