package adoption

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationBeginEnd: Begin creates the marker that slot.ReadSlot
// finds (Info.Adopting) and keeps a second session out
// with slot.ErrBusy; a session that ends (its relay died) leaves the
// marker and frees the lock, and the next adopter begins over the marker;
// End drops the marker and frees the lock.
func TestIntegrationBeginEnd(t *testing.T) {
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	first, second, third := backfillTestConnect(t, pg.URL("app")), backfillTestConnect(t, pg.URL("app")), backfillTestConnect(t, pg.URL("app"))
	const name = "cdcrelay_outbox"
	adopting := func(want bool) {
		t.Helper()
		info, err := slot.ReadSlot(ctx, third, name)
		if err != nil {
			t.Fatal(err)
		}
		if info.Adopting != want {
			t.Fatalf("ReadSlot(%q).Adopting = %v, want %v", name, info.Adopting, want)
		}
	}
	adopting(false)
	if err := Begin(ctx, first, name); err != nil {
		t.Fatal(err)
	}
	adopting(true)
	if err := Begin(ctx, second, name); !errors.Is(err, slot.ErrBusy) {
		t.Fatalf("Begin while another session adopts: %v, want slot.ErrBusy", err)
	}
	// The server ends the session, and its lock, a moment after the
	// connection closes.
	pid := first.PgConn().PID()
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		var gone bool
		if err := third.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&gone); err != nil {
			t.Fatal(err)
		}
		if gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session of pid %d still runs 10 s after its connection closed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	adopting(true)
	if err := Begin(ctx, second, name); err != nil {
		t.Fatalf("Begin over the marker of a session that ended: %v", err)
	}
	if err := End(ctx, second, name); err != nil {
		t.Fatal(err)
	}
	adopting(false)
	if err := Begin(ctx, third, name); err != nil {
		t.Fatalf("Begin after End: %v", err)
	}
	if err := End(ctx, third, name); err != nil {
		t.Fatal(err)
	}
	adopting(false)
}
