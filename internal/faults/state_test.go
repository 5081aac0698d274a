package faults_test

import (
	"context"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// commitLSN returns the commit LSN (the relay's header) of the transaction
// holding event id, from its first delivery. A slot confirmed at or below
// it has not passed that transaction: logical decoding sends again every
// transaction whose commit record is not below the confirmed position.
func (w *world) commitLSN(t *testing.T, id string) pglogrepl.LSN {
	t.Helper()
	return relaytest.CommitLSN(t, w.consumer, id)
}

// currentLSN is the WAL insert position now: every transaction committed
// before this call ends below it.
func currentLSN(t *testing.T, db *pgx.Conn) pglogrepl.LSN {
	t.Helper()
	var lsn pglogrepl.LSN
	if err := db.QueryRow(context.Background(), `SELECT pg_current_wal_insert_lsn()`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}
