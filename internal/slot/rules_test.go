package slot

import (
	"errors"
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// TestSlotProblems: which slots the relay refuses (and with which
// sentinel), which it streams from with a warning, and which it takes.
func TestSlotProblems(t *testing.T) {
	ok := Info{Exists: true, Type: "logical", Plugin: "pgoutput", Database: "app", CurrentDatabase: "app", WALStatus: "reserved", Retained: "56 bytes"}
	lost := ok
	lost.WALStatus, lost.Lost, lost.Invalidation = "lost", true, "wal_status lost"
	conflicting := ok
	conflicting.Lost, conflicting.Invalidation = true, "rows_removed"
	with := func(f func(*Info)) Info { i := ok; f(&i); return i }
	tests := []struct {
		name     string
		info     Info
		recreate bool
		fatal    error // the sentinel of a fatal problem; nil for none
		warn     bool
		message  string
	}{
		{"missing", Info{CurrentDatabase: "app"}, false, nil, false, ""},
		{"good", ok, false, nil, false, ""},
		{"active", with(func(i *Info) { i.Active, i.ActivePID = true, 42 }), false, nil, false, ""},
		{"plugin", with(func(i *Info) { i.Plugin = "test_decoding" }), false, ErrSlotMismatch, false, "logical slot with plugin test_decoding; the relay needs a logical pgoutput slot"},
		{"physical", with(func(i *Info) { i.Type, i.Plugin, i.Database = "physical", "", "" }), false, ErrSlotMismatch, false, "is a physical slot;"},
		{"other db", with(func(i *Info) { i.Database = "billing" }), false, ErrSlotMismatch, false, "belongs to database billing, not app"},
		{"temporary", with(func(i *Info) { i.Temporary = true }), false, ErrSlotMismatch, false, "is temporary"},
		{"lost, stop", lost, false, ErrSlotLost, false, "invalidated (wal_status lost): WAL it still needed was removed (max_slot_wal_keep_size), and CDCRELAY_SLOT_LOST=stop makes the relay stop"},
		{"lost, recreate", lost, true, nil, true, "with CDCRELAY_SLOT_LOST=recreate the relay drops it"},
		{"conflicting, stop", conflicting, false, ErrSlotLost, false, "invalidated (rows_removed): PostgreSQL can no longer decode from it"},
		{"unreserved", with(func(i *Info) { i.WALStatus = "unreserved" }), false, nil, true, "slot cdcrelay exists (pgoutput, database app, wal_status unreserved, retaining 56 bytes of WAL): it is about to pass max_slot_wal_keep_size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps := SlotProblems(Scope{Outbox: config.Outbox{Slot: "cdcrelay"}, RecreateLost: tt.recreate}, tt.info)
			err := refusal(ps)
			switch {
			case tt.fatal == nil && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.fatal != nil && (!errors.Is(err, tt.fatal) || !strings.Contains(err.Error(), tt.message)):
				t.Fatalf("error %v; want %v with %q", err, tt.fatal, tt.message)
			case tt.warn && (len(ps) != 1 || ps[0].Fatal || !strings.Contains(ps[0].Message, tt.message) || ps[0].Remedy == ""):
				t.Fatalf("problems %+v; want one warning with %q and a remedy", ps, tt.message)
			case tt.fatal == nil && !tt.warn && len(ps) != 0:
				t.Fatalf("problems %+v; want none", ps)
			}
		})
	}
}

// TestTableProblems: a missing table, one renamed or moved (the only
// table its publication publishes), and a relation that is not a table.
func TestTableProblems(t *testing.T) {
	s := Scope{Outbox: config.Outbox{Publication: "cdcrelay_outbox", Schema: "public", Table: "event_outbox"}, Quote: func(id string) string { return id }}
	missing := TableFacts{Relation: Relation{Schema: "public", Name: "event_outbox"}, Database: "app"}
	moved := PublicationFacts{Exists: true, Insert: true, Tables: []Relation{{OID: 7, Schema: "archive", Name: "event_outbox", Kind: "r"}}}
	view := missing
	view.OID, view.Kind = 7, "v"
	table := missing
	table.OID, table.Kind = 7, "r"
	for _, tt := range []struct {
		name            string
		tf              TableFacts
		p               PublicationFacts
		message, remedy string // "" for no problem
	}{
		{"a table", table, moved, "", ""},
		{"missing", missing, PublicationFacts{}, "table public.event_outbox does not exist in database app", "run `cdcrelay migrate` (as the schema owner)"},
		{"renamed or moved", missing, moved, "does not exist in database app, but publication cdcrelay_outbox publishes archive.event_outbox (the same table renamed or moved?)", "set CDCRELAY_TABLE=archive.event_outbox, or rename it back"},
		{"a view", view, PublicationFacts{}, "public.event_outbox is not a table (relkind v)", "set CDCRELAY_TABLE to the outbox table itself"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ps := TableProblems(s, tt.tf, tt.p)
			if tt.message == "" {
				if len(ps) != 0 {
					t.Fatalf("problems %+v; want none", ps)
				}
				return
			}
			if len(ps) != 1 || !ps[0].Fatal || !errors.Is(ps[0].Err, ErrPublication) || !strings.Contains(ps[0].Message, tt.message) || !strings.Contains(ps[0].Remedy, tt.remedy) {
				t.Fatalf("problems %+v; want one fatal with %q, remedy %q", ps, tt.message, tt.remedy)
			}
		})
	}
}
