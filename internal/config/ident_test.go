package config

import (
	"context"
	"strings"
	"testing"

	"github.com/sethvargo/go-envconfig"
)

func TestSplitTable(t *testing.T) {
	long := strings.Repeat("a", 63)
	tests := []struct {
		in, schema, table string
	}{
		{"event_outbox", "public", "event_outbox"},
		{"public.event_outbox", "public", "event_outbox"},
		{"orders.event_outbox", "orders", "event_outbox"},
		{"Orders.Event_Outbox", "orders", "event_outbox"}, // unquoted: folded
		{`"Billing"."Outbox Events"`, "Billing", "Outbox Events"},
		{`"a.b"."c""d"`, "a.b", `c"d`},
		{`billing."Outbox"`, "billing", "Outbox"},
		{`"Outbox"`, "public", "Outbox"},
		{"  spaced.around  ", "spaced", "around"},
		{"t$1._x9", "t$1", "_x9"},
		{"café.ördersÄ", "café", "ördersÄ"}, // non-ASCII letters are kept as written
		{long + "." + long, long, long},
		{`"` + strings.Repeat("é", 31) + `"`, "public", strings.Repeat("é", 31)}, // 62 bytes
	}
	for _, tt := range tests {
		schema, table, err := SplitTable(tt.in)
		if err != nil || schema != tt.schema || table != tt.table {
			t.Errorf("SplitTable(%q) = %q, %q, %v; want %q, %q", tt.in, schema, table, err, tt.schema, tt.table)
		}
	}
	bad := []struct{ in, want string }{
		{"", "empty"},
		{"   ", "empty"},
		{"a.b.c", "want table or schema.table"},
		{".t", "empty identifier"},
		{"s.", "empty identifier"},
		{"s..t", "empty identifier"},
		{`""`, "cannot be empty"},
		{`s.""`, "cannot be empty"},
		{`"unterminated`, "unterminated"},
		{`"a"b`, "unexpected"},
		{"Outbox Events", "unexpected"},
		{"1table", "cannot start with"},
		{"$t", "cannot start with"},
		{"my-table", "unexpected"},
		{"s.t;drop", "unexpected"},
		{`a."b`, "unterminated"},
		{strings.Repeat("a", 64), "64 bytes"},
		{`"` + strings.Repeat("é", 32) + `"`, "64 bytes"},
		{"bad\xff", "UTF-8"},
		{"\"a\x00b\"", "NUL"},
	}
	for _, tt := range bad {
		if s, tb, err := SplitTable(tt.in); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("SplitTable(%q) = %q, %q, %v; want an error with %q", tt.in, s, tb, err, tt.want)
		}
	}
}

func TestParseIdent(t *testing.T) {
	for in, want := range map[string]string{
		"cdcrelay_outbox": "cdcrelay_outbox", "Cdcrelay_Outbox": "cdcrelay_outbox", `"My Pub"`: "My Pub",
		`"a.b"`: "a.b", `"say ""hi"""`: `say "hi"`, "RoutingKey": "routingkey", `"RoutingKey"`: "RoutingKey",
	} {
		if got, err := ParseIdent(in); err != nil || got != want {
			t.Errorf("ParseIdent(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "a.b", "My Pub", `"x`, `""`, "x-y", strings.Repeat("p", 64)} {
		if got, err := ParseIdent(in); err == nil {
			t.Errorf("ParseIdent(%q) = %q, want an error", in, got)
		}
	}
}

// TestIdentifiersLoaded: Load turns the configured publication and column
// identifiers into real names, keeps lower-case configurations as they are,
// and names each bad one.
func TestIdentifiersLoaded(t *testing.T) {
	c, err := load(t, map[string]string{
		"DATABASE_URL": "postgres://db/app", "TABLE": `"Billing"."Outbox Events"`, "PUBLICATION": `"Billing Pub"`,
		"ID_COLUMN": `"EventId"`, "ROUTING_KEY_COLUMN": "Routing_Key", "PAYLOAD_COLUMN": `"pay""load"`,
		"HEADERS_COLUMN": `"Headers"`, "EXCHANGE_COLUMN": "exch", "TYPE_COLUMN": `"Type"`,
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Publication != "Billing Pub" || c.IDColumn != "EventId" || c.RoutingKeyColumn != "routing_key" ||
		c.PayloadColumn != `pay"load` || c.HeadersColumn != "Headers" || c.ExchangeColumn != "exch" || c.TypeColumn != "Type" {
		t.Fatalf("names %+v", c)
	}
	if c.Table != `"Billing"."Outbox Events"` {
		t.Fatalf("table %q: want it as configured (SplitTable reads it)", c.Table)
	}
	if s, tb, err := SplitTable(c.Table); err != nil || s != "Billing" || tb != "Outbox Events" {
		t.Fatalf("SplitTable: %q %q %v", s, tb, err)
	}

	c, err = load(t, map[string]string{"DATABASE_URL": "postgres://db/app"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Publication != "cdcrelay_outbox" || c.IDColumn != "id" || c.RoutingKeyColumn != "routing_key" || c.PayloadColumn != "payload" ||
		c.HeadersColumn != "headers" || c.ExchangeColumn != "exchange" || c.TypeColumn != "event_type" {
		t.Fatalf("default names changed: %+v", c)
	}

	_, err = load(t, map[string]string{
		"DATABASE_URL": "postgres://db/app", "TABLE": "Outbox Events", "PUBLICATION": "my-pub",
		"ID_COLUMN": `"`, "PAYLOAD_COLUMN": "a.b", "TYPE_COLUMN": `""`,
	})
	if err == nil {
		t.Fatal("bad identifiers accepted")
	}
	for _, want := range []string{"CDCRELAY_TABLE:", "CDCRELAY_PUBLICATION:", "CDCRELAY_ID_COLUMN:", "CDCRELAY_PAYLOAD_COLUMN:", "CDCRELAY_TYPE_COLUMN:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%s", want, err)
		}
	}
}

// FuzzIdent: SplitTable never panics, and whatever it accepts round-trips:
// quoting the real names and reading them back gives the same names.
func FuzzIdent(f *testing.F) {
	for _, s := range []string{"public.event_outbox", `"Billing"."Outbox Events"`, `"a.b"."c""d"`, "A.B", `"x`, "a..b", "é.ü"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		schema, table, err := SplitTable(in)
		if err != nil {
			return
		}
		quote := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
		s2, t2, err := SplitTable(quote(schema) + "." + quote(table))
		if err != nil || s2 != schema || t2 != table {
			t.Fatalf("%q -> %q.%q -> %q.%q, %v", in, schema, table, s2, t2, err)
		}
		_, err = LoadFrom(context.Background(), envconfig.MapLookuper(map[string]string{
			Prefix + "DATABASE_URL": "postgres://db/app", Prefix + "TABLE": in, Prefix + "PUBLICATION": in[:min(len(in), 8)],
		}))
		_ = err // must not panic
	})
}
