package relay

import (
	"errors"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// TestWantFailover: auto asks for a failover slot where the server can
// keep one; on makes a server that cannot a fatal error; off never asks.
func TestWantFailover(t *testing.T) {
	p17, p16, s17 := pgcaps.Caps{Version: 170010}, pgcaps.Caps{Version: 160014}, pgcaps.Caps{Version: 170010, InRecovery: true}
	for _, c := range []struct {
		setting string
		server  pgcaps.Caps
		want    bool
		fatal   bool
	}{
		{config.SlotFailoverAuto, p17, true, false},
		{config.SlotFailoverAuto, p16, false, false},
		{config.SlotFailoverAuto, s17, false, false},
		{config.SlotFailoverOn, p17, true, false},
		{config.SlotFailoverOn, p16, false, true},
		{config.SlotFailoverOn, s17, false, true},
		{config.SlotFailoverOff, p17, false, false},
	} {
		got, err := wantFailover(c.setting, c.server)
		if got != c.want || (err != nil) != c.fatal {
			t.Errorf("%s on %s: %v, %v; want %v, error %v", c.setting, c.server, got, err, c.want, c.fatal)
		}
		if err != nil && (!IsFatal(err) || !errors.Is(err, slot.ErrFailoverUnsupported)) {
			t.Errorf("%s on %s: %v is not fatal", c.setting, c.server, err)
		}
	}
}
