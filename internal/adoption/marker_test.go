package adoption

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestMarkerNamesCollisionFree: slot names sharing a long prefix get
// markers of their own, names that could not are refused, and no accepted
// name is another accepted name's marker.
func TestMarkerNamesCollisionFree(t *testing.T) {
	prefix := strings.Repeat("a", 53)
	accepted := []string{"cdcrelay_outbox", "a", prefix, prefix + "b", prefix + "c", strings.Repeat("z", config.MaxSlotNameLen), "x_adoptin", "adopting", "_adopting_x"}
	refused := []string{
		prefix + "bc",                    // 55: the old truncation gave it prefix+"b"'s marker
		strings.Repeat("a", 63),          // the longest legal slot name
		"orders" + config.AdoptionSuffix, // another slot's marker
		strings.Repeat("q", 45) + config.AdoptionSuffix,
	}
	markers := map[string]string{}
	for _, name := range accepted {
		if err := config.CheckSlotName(name); err != nil {
			t.Fatalf("CheckSlotName(%q): %v", name, err)
		}
		m := MarkerName(name)
		if len(m) > 63 {
			t.Fatalf("marker of %q is %d characters", name, len(m))
		}
		if other, ok := markers[m]; ok {
			t.Fatalf("%q and %q share the marker %q", name, other, m)
		}
		markers[m] = name
		if config.CheckSlotName(m) == nil {
			t.Fatalf("the marker %q of %q is itself an accepted slot name", m, name)
		}
	}
	for _, name := range refused {
		err := config.CheckSlotName(name)
		if err == nil {
			t.Fatalf("CheckSlotName(%q) accepted a name whose marker could collide", name)
		}
		if !strings.Contains(err.Error(), name) {
			t.Fatalf("CheckSlotName(%q): %v does not name the slot", name, err)
		}
	}
}

// TestIntegrationBeginEnd: Begin creates the marker under the name
// slot.ReadSlot looks for (Info.Adopting; package slot spells the name
// itself, as it cannot import this one) and keeps a second session out
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
