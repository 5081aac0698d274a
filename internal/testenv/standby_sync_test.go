//go:build pgmatrix

package testenv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file needs PostgreSQL 17 or later: make test-pg-matrix runs it
// (build tag pgmatrix).

// TestIntegrationFailoverSlotsSyncToStandby: on 17 and later, a standby
// started with sync_replication_slots=on gets the primary's failover slots,
// which is what a relay needs to go on from a promoted standby.
func TestIntegrationFailoverSlotsSyncToStandby(t *testing.T) {
	t.Parallel()
	major, err := PGMajor()
	if err != nil {
		t.Fatal(err)
	}
	if major < 17 {
		t.Fatalf("PostgreSQL %d has no failover slots (17 and later): run this test with make test-pg-matrix, or set %s", major, PGBinEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary := MustPostgres(t, PostgresOptions{Settings: map[string]string{"synchronized_standby_slots": "standby1"}})
	standby := MustStandby(t, primary, StandbyOptions{Settings: map[string]string{"sync_replication_slots": "on"}})
	pconn := connect(ctx, t, primary.URL("postgres"))
	defer pconn.Close(ctx)
	mustExec(ctx, t, pconn, "SELECT pg_create_logical_replication_slot('relay_slot', 'pgoutput', false, false, true)")
	mustExec(ctx, t, pconn, "CREATE TABLE t (v int)")
	lsn, err := primary.CurrentLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(ctx, t, pconn, "SELECT pg_replication_slot_advance('relay_slot', pg_current_wal_lsn())")
	if err := standby.WaitReplayed(ctx, lsn); err != nil {
		t.Fatal(err)
	}
	sconn := connect(ctx, t, standby.URL("postgres"))
	defer sconn.Close(ctx)
	start := time.Now()
	for {
		var synced bool
		err := sconn.QueryRow(ctx, "SELECT synced FROM pg_replication_slots WHERE slot_name = 'relay_slot'").Scan(&synced)
		if err == nil && synced {
			break
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if time.Since(start) > 2*time.Minute {
			t.Fatal("failover slot relay_slot not synced to the standby after 2 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("failover slot synced after %v", time.Since(start))
	var standbyNames string
	if err := sconn.QueryRow(ctx, "SHOW synchronized_standby_slots").Scan(&standbyNames); err != nil || standbyNames != "" {
		t.Errorf("standby inherited synchronized_standby_slots %q (err %v), want none", standbyNames, err)
	}
}
