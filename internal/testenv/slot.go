package testenv

import (
	"context"
	"strings"
	"sync"
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

// Buffer collects a process's output from several goroutines.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
