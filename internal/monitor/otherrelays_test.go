package monitor

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// streamSlot creates pgoutput slot name and streams it on a replication
// connection named app, as a relay (app cdcrelay) or a subscriber would;
// the returned func closes it.
func streamSlot(t *testing.T, dbURL, name, app string) func() {
	t.Helper()
	return stream(t, dbURL, name, app, true)
}

// stream streams pgoutput slot name, created first if create, on a
// replication connection named app; the returned func closes it. A slot on
// a standby is created beforehand (createSlotOnStandby): its creation
// waits for the primary.
func stream(t *testing.T, dbURL, name, app string, create bool) func() {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgconn.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	closeConn := func() { _ = conn.Close(context.Background()) }
	t.Cleanup(closeConn)
	if create {
		if _, err := pglogrepl.CreateReplicationSlot(ctx, conn, name, "pgoutput", pglogrepl.CreateReplicationSlotOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	err = pglogrepl.StartReplication(ctx, conn, name, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'cdcrelay_outbox'"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return closeConn
}

// TestIntegrationMonitorOtherRelay: another pgoutput slot of the database
// streamed by a connection named cdcrelay is another relay: the holder
// logs its name once and exports cdcrelay_other_relay_slots = 1; a
// subscriber's slot (another application_name) does not count; when the
// other relay goes, the gauge is 0 again and a line says so.
func TestIntegrationMonitorOtherRelay(t *testing.T) {
	_, dbURL := database(t)
	r := start(t, Options{DatabaseURL: dbURL, Outbox: config.Outbox{Schema: "public", Table: "event_outbox", Slot: "a"}})
	key := "cdcrelay_other_relay_slots{slot=a}"
	waitFor(t, "the first refresh", func() bool { v, ok := r.series(t)[key]; return ok && v == 0 })
	streamSlot(t, dbURL, "subscriber_slot", "a_subscriber")
	stopB := streamSlot(t, dbURL, "b", "cdcrelay")
	waitFor(t, "the other relay counted", func() bool { return r.series(t)[key] == 1 })
	waitFor(t, "the other relay logged", func() bool { return strings.Contains(r.logs.String(), "other_slots=b ") })
	if strings.Contains(r.logs.String(), "subscriber_slot") {
		t.Fatalf("a subscriber's slot was reported as a relay:\n%s", r.logs.String())
	}
	stopB()
	waitFor(t, "the other relay gone", func() bool { return r.series(t)[key] == 0 })
	waitFor(t, "the other relay's departure logged", func() bool {
		return strings.Contains(r.logs.String(), "no other relay streams this database any more")
	})
	if n := strings.Count(r.logs.String(), "another relay streams this database"); n != 1 {
		t.Fatalf("the other relay was logged %d times, want once:\n%s", n, r.logs.String())
	}
}

// TestRelayNames: another relay's walsender may carry the default name or
// the application_name of either URL; each counts once, and an empty one
// never (it would take every unnamed walsender for a relay).
func TestRelayNames(t *testing.T) {
	for _, c := range []struct {
		urls []string
		want string
	}{
		{[]string{"postgres://u@p/app", ""}, "cdcrelay"},
		{[]string{"postgres://u@p/app?application_name=orders", ""}, "cdcrelay,orders"},
		{[]string{"postgres://u@p/app?application_name=orders", "postgres://u@s/app?application_name=orders_sb"}, "cdcrelay,orders,orders_sb"},
		{[]string{"postgres://u@p/app?application_name=", "postgres://u@s/app?application_name=orders"}, "cdcrelay,orders"},
	} {
		if got := strings.Join(relayNames(c.urls...), ","); got != c.want {
			t.Errorf("%q: %s, want %s", c.urls, got, c.want)
		}
	}
}
