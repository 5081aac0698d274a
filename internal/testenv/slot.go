package testenv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// ConfirmedFlush reads a slot's confirmed_flush_lsn (0 when unset).
func ConfirmedFlush(tb testing.TB, db *pgx.Conn, slot string) pglogrepl.LSN {
	tb.Helper()
	var lsn *pglogrepl.LSN
	err := db.QueryRow(context.Background(), `SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&lsn)
	if err != nil {
		tb.Fatalf("read slot %s: %v", slot, err)
	}
	if lsn == nil {
		return 0
	}
	return *lsn
}

// WaitConfirmed waits until the slot's confirmed position reaches lsn.
func WaitConfirmed(tb testing.TB, db *pgx.Conn, slot string, lsn pglogrepl.LSN, within time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for {
		got := ConfirmedFlush(tb, db, slot)
		if got >= lsn {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("slot confirmed_flush_lsn %s, want at least %s after %s", got, lsn, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitCount waits until the consumer has at least n deliveries.
func WaitCount(tb testing.TB, c *Consumer, n int, within time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := c.WaitCount(ctx, n); err != nil {
		tb.Fatal(err)
	}
}

// Walsender returns the pid of the walsender streaming the slot, 0 when the
// slot is inactive or missing.
func Walsender(tb testing.TB, db *pgx.Conn, slot string) int {
	tb.Helper()
	var pid *int32
	err := db.QueryRow(context.Background(), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && pid == nil) {
		return 0
	}
	if err != nil {
		tb.Fatalf("read slot %s: %v", slot, err)
	}
	return int(*pid)
}

// WaitSlotActive waits until a relay streams from the slot and returns
// its walsender's pid. Rows committed before the slot exists are not in its
// stream (adopting them is the snapshot backfill's job), so stream tests
// start inserting only then.
func WaitSlotActive(tb testing.TB, db *pgx.Conn, slot string, within time.Duration) int {
	tb.Helper()
	deadline := time.Now().Add(within)
	for {
		if pid := Walsender(tb, db, slot); pid != 0 {
			return pid
		}
		if time.Now().After(deadline) {
			tb.Fatalf("slot %s not active after %s", slot, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
