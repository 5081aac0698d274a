package pgcaps_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationProbe: on a real server (CDCRELAY_PG_BIN picks the
// major), Probe reads the major its binaries are, a primary and then a
// standby as such, and when each started; the server_version the server
// reports at connection start gives the same major.
func TestIntegrationProbe(t *testing.T) {
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	major, err := pg.Major()
	if err != nil {
		t.Fatal(err)
	}
	standby := testenv.MustStandby(t, pg, testenv.StandbyOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name       string
		url        string
		inRecovery bool
	}{
		{"primary", pg.URL("postgres"), false},
		{"standby", standby.URL("postgres"), true},
	} {
		db, err := pgx.Connect(ctx, tc.url)
		if err != nil {
			t.Fatal(err)
		}
		caps, err := pgcaps.Probe(ctx, db)
		startup := pgcaps.FromServerVersion(db.PgConn().ParameterStatus("server_version"))
		_ = db.Close(ctx)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if caps.Version/10000 != major || startup.Version/10000 != major {
			t.Errorf("%s: probed %d, at connection start %d; want major %d", tc.name, caps.Version, startup.Version, major)
		}
		if caps.InRecovery != tc.inRecovery {
			t.Errorf("%s: InRecovery %v, want %v", tc.name, caps.InRecovery, tc.inRecovery)
		}
		if caps.Started.IsZero() || caps.Started.After(time.Now()) {
			t.Errorf("%s: Started %v, want a start time in the past", tc.name, caps.Started)
		}
		t.Logf("%s: %s", tc.name, caps)
	}
}
