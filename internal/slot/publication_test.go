package slot

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// TestPublicationRefusal: the problems the relay refuses to stream on
// (the first fatal one is its error), and the foreign relations it skips.
func TestPublicationRefusal(t *testing.T) {
	outbox := Relation{OID: 100, Schema: "public", Name: "event_outbox", Kind: "r"}
	parted := Relation{OID: 200, Schema: "Billing", Name: "Outbox Events", Kind: "p"}
	moved := Relation{OID: 100, Schema: "archive", Name: "event_outbox", Kind: "r"}
	other := Relation{OID: 300, Schema: "public", Name: "orders", Kind: "r"}
	part1 := Relation{OID: 201, Schema: "Billing", Name: "Outbox Events_2026", Kind: "r"}
	good := PublicationFacts{Exists: true, Insert: true, Tables: []Relation{outbox}}
	tests := []struct {
		name  string
		table Relation
		found bool
		p     PublicationFacts
		want  string // "" for no error; else a part of the message
		// foreign are the OIDs returned as foreign when there is no error.
		foreign []uint32
	}{
		{"exactly the table", outbox, true, good, "", nil},
		{"partitioned through its root", parted, true, PublicationFacts{Exists: true, Insert: true, ViaRoot: true, Tables: []Relation{parted}}, "", nil},
		{"partitioned, rows under the partitions' names", parted, true, PublicationFacts{Exists: true, Insert: true, Tables: []Relation{part1}, Kin: map[uint32]bool{201: true}, Parts: map[uint32]bool{201: true}},
			`ALTER PUBLICATION "cdcrelay_outbox" SET (publish_via_partition_root = true)`, nil},
		{"missing publication", outbox, true, PublicationFacts{}, "so the relay cannot start: run `cdcrelay migrate` as the owner", nil},
		{"missing publication, partitioned table", parted, true, PublicationFacts{}, "publish_via_partition_root = true", nil},
		{"for all tables", outbox, true, PublicationFacts{Exists: true, AllTables: true, Insert: true, Tables: []Relation{other, outbox}}, "FOR ALL TABLES", nil},
		{"no inserts", outbox, true, PublicationFacts{Exists: true, Tables: []Relation{outbox}}, "SET (publish = 'insert')", nil},
		{"another table only", outbox, true, PublicationFacts{Exists: true, Insert: true, Tables: []Relation{other}},
			`does not cover "public"."event_outbox": the relay would receive no events: ALTER PUBLICATION "cdcrelay_outbox" SET TABLE "public"."event_outbox"`, nil},
		{"a foreign table too", outbox, true, PublicationFacts{Exists: true, Insert: true, Tables: []Relation{outbox, other}}, "", []uint32{300}},
		{"a partition of the outbox too", parted, true, PublicationFacts{Exists: true, Insert: true, ViaRoot: true, Tables: []Relation{part1, parted}, Kin: map[uint32]bool{201: true}, Parts: map[uint32]bool{201: true}},
			`also covers "Billing"."Outbox Events_2026", of the partition or inheritance tree`, nil},
		{"an ancestor of the outbox too", part1, true, PublicationFacts{Exists: true, Insert: true, Tables: []Relation{parted, part1, other}, Kin: map[uint32]bool{200: true}},
			`also covers "Billing"."Outbox Events", of the partition`, nil},
		{"no tables", outbox, true, PublicationFacts{Exists: true, Insert: true}, "does not cover", nil},
		{"renamed or moved", Relation{Schema: "public", Name: "event_outbox"}, false, PublicationFacts{Exists: true, Insert: true, Tables: []Relation{moved}},
			`renamed or moved?): set CDCRELAY_TABLE="archive"."event_outbox"`, nil},
		{"missing table", Relation{Schema: "public", Name: "event_outbox"}, false, PublicationFacts{Exists: true, Insert: true}, "does not exist in database app: run `cdcrelay migrate`", nil},
		{"missing table and publication", Relation{Schema: "public", Name: "event_outbox"}, false, PublicationFacts{}, "does not exist in database app: run `cdcrelay migrate`", nil},
		{"missing publication the role creates at start", outbox, true, PublicationFacts{CanCreate: true}, "", nil},
		{"updates too: a warning", outbox, true, PublicationFacts{Exists: true, Insert: true, Update: true, Tables: []Relation{outbox}}, "", nil},
		{"a row filter: a warning", outbox, true, PublicationFacts{Exists: true, Insert: true, RowFilter: "(kind <> 'x')", Tables: []Relation{outbox}}, "", nil},
		{"a column list without the payload", outbox, true, PublicationFacts{Exists: true, Insert: true, Tables: []Relation{outbox}, Columns: []string{"id", "routing_key"}},
			`column list leaves out payload: the relay stops at the first row: ALTER PUBLICATION "cdcrelay_outbox" SET TABLE "public"."event_outbox"; (all columns)`, nil},
		{"a column list without an optional column", outbox, true, PublicationFacts{Exists: true, Insert: true, Tables: []Relation{outbox}, Columns: []string{"id", "routing_key", "payload"}}, "", nil},
	}
	s := Scope{Outbox: config.Outbox{Publication: "cdcrelay_outbox", Slot: "cdcrelay"}}
	m := Mapped{Required: []string{"id", "routing_key", "payload"}, Optional: []string{"headers", "", ""}}
	cols := Columns{"id": "", "routing_key": "", "payload": "", "headers": ""}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tf := TableFacts{Relation: tt.table, Database: "app", Role: "relay"}
			if !tt.found {
				tf.Kind = ""
			}
			s.Schema, s.Table = tt.table.Schema, tt.table.Name
			err := refusal(TableProblems(s, tf, tt.p), PublicationProblems(s, tf, tt.p, cols, m), GeneratedProblems(s, tt.p, cols, m))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				_, _, foreign := split(tf, tt.p)
				var got []uint32
				for _, rel := range foreign {
					got = append(got, rel.OID)
				}
				if !slices.Equal(got, tt.foreign) {
					t.Fatalf("foreign %v, want %v", got, tt.foreign)
				}
				return
			}
			if !errors.Is(err, ErrPublication) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v; want ErrPublication with %q", err, tt.want)
			}
		})
	}
}

func TestCreatePublicationSQL(t *testing.T) {
	if got := createPublicationSQL("cdcrelay_outbox", Relation{Schema: "public", Name: "event_outbox", Kind: "r"}); got !=
		`CREATE PUBLICATION "cdcrelay_outbox" FOR TABLE "public"."event_outbox" WITH (publish = 'insert')` {
		t.Fatal(got)
	}
	if got := createPublicationSQL("My Pub", Relation{Schema: "Billing", Name: `Outbox "Events"`, Kind: "p"}); got !=
		`CREATE PUBLICATION "My Pub" FOR TABLE "Billing"."Outbox ""Events""" WITH (publish = 'insert', publish_via_partition_root = true)` {
		t.Fatal(got)
	}
}

func TestPublicationNamesArg(t *testing.T) {
	for in, want := range map[string]string{
		"cdcrelay_outbox": `'"cdcrelay_outbox"'`, "My Pub": `'"My Pub"'`, `it's "x"`: `'"it''s ""x"""'`,
	} {
		if got := PublicationNamesArg(in); got != want {
			t.Errorf("PublicationNamesArg(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestGeneratedProblems(t *testing.T) {
	plain := PublicationFacts{Exists: true, Insert: true}
	stored := plain
	stored.GenColsStored = true
	key := Columns{"id": "", "routing_key": "s"}
	virtual := Columns{"routing_key": "v"}
	tests := []struct {
		name string
		p    PublicationFacts
		cols Columns
		want string // "" for no error
	}{
		{"none generated", plain, nil, ""},
		{"stored, before 18", plain, key, `column "routing_key" of "public"."event_outbox" is GENERATED ALWAYS AS (…) STORED: PostgreSQL before 18 does not publish generated columns`},
		{"stored, remedy", plain, key, "make it a plain column filled by the application or a BEFORE INSERT trigger"},
		{"stored, publish_generated_columns = stored", stored, key, ""},
		{"virtual, never published", stored, virtual, "VIRTUAL: logical replication never publishes"},
		{"generated but not mapped", plain, Columns{"kind_upper": "s"}, ""},
	}
	s := Scope{Outbox: config.Outbox{Publication: "cdcrelay_outbox", Schema: "public", Table: "event_outbox"}}
	m := Mapped{Required: []string{"id", "routing_key", "payload"}, Optional: []string{"", "", ""}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := refusal(GeneratedProblems(s, tt.p, tt.cols, m))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrPublication) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v; want ErrPublication with %q", err, tt.want)
			}
		})
	}
}
