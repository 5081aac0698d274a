package preflight

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

func TestWriteAlignsAndCounts(t *testing.T) {
	fs := []Finding{
		{Check: "wal_level", Severity: OK, Message: "logical", Remedy: "never shown for OK"},
		{Check: "max_slot_wal_keep_size", Severity: Warn, Message: "unset", Remedy: "set it"},
		{Check: "publication", Severity: Error, Message: "missing\nacross lines", Remedy: "cdcrelay migrate"},
	}
	var b bytes.Buffer
	if n := Write(&b, fs); n != 1 {
		t.Fatalf("Write returned %d errors, want 1", n)
	}
	want := "" +
		"OK     wal_level               logical\n" +
		"WARN   max_slot_wal_keep_size  unset  remedy: set it\n" +
		"ERROR  publication             missing across lines  remedy: cdcrelay migrate\n" +
		"1 error, 1 warning, 1 ok\n"
	if b.String() != want {
		t.Fatalf("Write output:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	if n := Write(&b, nil); n != 0 || b.String() != "0 errors, 0 warnings, 0 ok\n" {
		t.Fatalf("empty: %d %q", n, b.String())
	}
}

func TestSeverityString(t *testing.T) {
	for s, want := range map[Severity]string{OK: "OK", Warn: "WARN", Error: "ERROR", 7: "Severity(7)"} {
		if s.String() != want {
			t.Errorf("%d: %q, want %q", int(s), s.String(), want)
		}
	}
}

func TestScrubRemovesSecrets(t *testing.T) {
	cfg := config.Config{
		DatabaseURL: "postgres://relay:pg-S3cret%2Fx@db:5432/orders",
		AMQPURL:     "amqp://relay:mq-S3cret@mq:bad/",
	}
	fs := scrub([]Finding{
		{Check: "database", Message: `parse "postgres://relay:pg-S3cret%2Fx@db:5432/orders": boom`, Remedy: "pg-S3cret/x"},
		{Check: "broker", Message: `parse "amqp://relay:mq-S3cret@mq:bad/": invalid port`, Remedy: "password mq-S3cret"},
	}, cfg.Scrub)
	var b bytes.Buffer
	Write(&b, fs)
	for _, secret := range []string{"pg-S3cret", "mq-S3cret"} {
		if strings.Contains(b.String(), secret) {
			t.Fatalf("output contains %q:\n%s", secret, b.String())
		}
	}
	if !strings.Contains(b.String(), "postgres://relay:xxxxx@db:5432/orders") {
		t.Fatalf("URL not shown redacted:\n%s", b.String())
	}
}

func TestScrubKeyValueDSN(t *testing.T) {
	cfg := config.Config{DatabaseURL: "host=db user=relay password=kv-S3cret dbname=orders"}
	fs := scrub([]Finding{{Message: "saw kv-S3cret"}}, cfg.Scrub)
	if strings.Contains(fs[0].Message, "kv-S3cret") {
		t.Fatal(fs[0].Message)
	}
}

// Run with nothing reachable returns Error findings, never panics, and
// never echoes a password, even from an AMQP URL net/url cannot parse.
func TestRunUnreachableIsFindings(t *testing.T) {
	cfg := config.Config{
		DatabaseURL: "postgres://relay:Unreachable-Pw1@127.0.0.1:1/app?connect_timeout=2",
		AMQPURL:     "amqp://relay:Unreachable-Pw2@127.0.0.1:notaport/",
		Table:       "public.event_outbox", Publication: "p", Slot: "s",
		IDColumn: "id", RoutingKeyColumn: "routing_key", PayloadColumn: "payload",
	}
	fs := Run(context.Background(), cfg, Options{Timeout: 3 * time.Second})
	var b bytes.Buffer
	if n := Write(&b, fs); n != 2 {
		t.Fatalf("want 2 errors (database, broker), got %d:\n%s", n, b.String())
	}
	for _, pw := range []string{"Unreachable-Pw1", "Unreachable-Pw2"} {
		if strings.Contains(b.String(), pw) {
			t.Fatalf("output contains the password %q:\n%s", pw, b.String())
		}
	}
	for _, f := range fs {
		if f.Remedy == "" {
			t.Errorf("finding without a remedy: %+v", f)
		}
	}
}

func TestClassifyWALLevel(t *testing.T) {
	if f := ClassifyWALLevel("logical", false); f.Severity != OK {
		t.Fatal(f)
	}
	f := ClassifyWALLevel("replica", false)
	if f.Severity != Error || !strings.Contains(f.Message, "replica") || !strings.Contains(f.Remedy, "wal_level = logical") {
		t.Fatal(f)
	}
	if f := ClassifyWALLevel("replica", true); !strings.Contains(f.Remedy, "restart") {
		t.Fatal(f)
	}
}

func TestClassifyHeadroom(t *testing.T) {
	for _, c := range []struct {
		limit, used, need int
		want              Severity
	}{
		{10, 3, 1, OK}, {10, 10, 0, OK}, {10, 9, 1, OK}, {10, 10, 1, Error}, {0, 0, 1, Error},
	} {
		if f := classifyHeadroom(checkSlots, c.limit, c.used, c.need, "slot"); f.Severity != c.want {
			t.Errorf("%+v: %v %q", c, f.Severity, f.Message)
		}
	}
}

func TestClassifyKeepSize(t *testing.T) {
	if f := classifyKeepSize(-1, true); f.Severity != Warn {
		t.Fatal(f)
	}
	if f := classifyKeepSize(-1, false); f.Severity != Warn {
		t.Fatal(f)
	}
	if f := classifyKeepSize(1024, true); f.Severity != OK || !strings.Contains(f.Message, "1024MB") {
		t.Fatal(f)
	}
}

func TestSyncStandbyMatches(t *testing.T) {
	for _, c := range []struct {
		setting, match string
		bad            bool
	}{
		{"", "", false},
		{"standby1", "", false},
		{"cdcrelay", "cdcrelay", false},
		{"CDCRelay", "CDCRelay", false},
		{`"CdcRelay"`, `"CdcRelay"`, false},
		{"*", "*", false},
		{`"*"`, `"*"`, false},
		{"s1, s2", "", false},
		{"s1, cdcrelay", "cdcrelay", false},
		{"FIRST 1 (s1, s2)", "", false},
		{"first 2 (s1, cdcrelay)", "cdcrelay", false},
		{"ANY 1 (s1, *)", "*", false},
		{"2 (s1, cdcrelay)", "cdcrelay", false},
		{"first, cdcrelay", "cdcrelay", false}, // a standby named "first"
		{"first", "", false},
		{`"cdcrelay check"`, "", false},
		{"cdcrelay_other", "", false},
		{"FIRST 1 (s1, s2", "", true},
		{`"unterminated`, "", true},
		{"s1,,s2", "", true},
		{"s1 s2", "", true},
	} {
		got, err := syncStandbyMatches(c.setting, ReplicationApplicationName)
		if (err != nil) != c.bad || got != c.match {
			t.Errorf("%q: got %q, %v; want %q, error %v", c.setting, got, err, c.match, c.bad)
		}
	}
}

func TestClassifySyncStandby(t *testing.T) {
	for setting, want := range map[string]Severity{"": OK, "s1": OK, "FIRST 1 (cdcrelay)": Error, "*": Error, `"x`: Warn} {
		if f := classifySyncStandby(setting); f.Severity != want {
			t.Errorf("%q: %v %s", setting, f.Severity, f.Message)
		}
	}
}

var tgt = target{
	schema: "public", table: "event_outbox", publication: "cdcrelay_outbox", slot: "cdcrelay_outbox",
	database: "app", role: "relay", id: "id", key: "routing_key", payload: "payload",
	headers: "headers", exch: "exchange", msgType: "event_type", poison: config.PoisonPark,
}

func TestClassifyPrivilegesNamesEachMissingOne(t *testing.T) {
	all := roleFacts{replication: true, schemaUsage: true, tableExists: true, selectPriv: true, deletePriv: true, hasPublishedAt: true, updatePublishedAt: true}
	fs := classifyPrivileges(tgt, all)
	if len(fs) != 1 || fs[0].Severity != OK || !strings.Contains(fs[0].Message, "REPLICATION, SELECT, UPDATE (published_at), DELETE") {
		t.Fatal(fs)
	}
	for _, c := range []struct {
		mutate       func(*roleFacts)
		priv, remedy string
	}{
		{func(r *roleFacts) { r.replication = false }, "lacks REPLICATION:", "ALTER ROLE relay REPLICATION;"},
		{func(r *roleFacts) { r.selectPriv = false }, "lacks SELECT on public.event_outbox", "GRANT SELECT ON public.event_outbox TO relay;"},
		{func(r *roleFacts) { r.updatePublishedAt = false }, "lacks UPDATE (published_at) on public.event_outbox", "GRANT UPDATE (published_at) ON public.event_outbox TO relay;"},
		{func(r *roleFacts) { r.deletePriv = false }, "lacks DELETE on public.event_outbox", "GRANT DELETE ON public.event_outbox TO relay;"},
		{func(r *roleFacts) { r.schemaUsage = false }, "lacks USAGE on schema public", "GRANT USAGE ON SCHEMA public TO relay;"},
	} {
		r := all
		c.mutate(&r)
		fs := classifyPrivileges(tgt, r)
		if len(fs) != 1 || fs[0].Severity != Error || !strings.Contains(fs[0].Message, c.priv) || !strings.HasPrefix(fs[0].Remedy, c.remedy) {
			t.Errorf("want one error %q / %q, got %+v", c.priv, c.remedy, fs)
		}
	}
	r := all
	r.cannotPark = []string{"attempts", "last_error"}
	if fs := classifyPrivileges(tgt, r); len(fs) != 2 || fs[0].Severity != Warn || !strings.Contains(fs[0].Remedy, "GRANT UPDATE (published_at, attempts, last_error)") || fs[1].Severity != OK {
		t.Errorf("parking columns not updatable: %+v", fs)
	}
	// No UPDATE at all: one error with the whole grant, no warning repeating it.
	r = all
	r.updatePublishedAt, r.cannotPark = false, []string{"attempts", "last_error"}
	if fs := classifyPrivileges(tgt, r); len(fs) != 1 || fs[0].Severity != Error ||
		!strings.Contains(fs[0].Message, "lacks UPDATE (published_at, attempts, last_error) on public.event_outbox") ||
		fs[0].Remedy != "GRANT UPDATE (published_at, attempts, last_error) ON public.event_outbox TO relay;" {
		t.Errorf("no UPDATE grant: want one error with the full grant, got %+v", fs)
	}
	r = all
	r.replication, r.rdsReplication = false, true
	if fs := classifyPrivileges(tgt, r); fs[0].Severity != OK {
		t.Error(fs)
	}
	if fs := classifyPrivileges(tgt, roleFacts{super: true}); len(fs) != 1 || fs[0].Severity != OK {
		t.Error(fs)
	}
	odd := tgt
	odd.role = "Relay-Svc"
	if fs := classifyPrivileges(odd, roleFacts{}); !strings.Contains(fs[0].Remedy, `ALTER ROLE "Relay-Svc" REPLICATION`) {
		t.Error(fs)
	}
}

func outboxColumns() tableFacts {
	return tableFacts{kind: "r", owner: "app", columns: []column{
		{"id", "uuid", "uuid", true},
		{"routing_key", "text", "text", true},
		{"payload", "jsonb", "jsonb", true},
		{"enqueued_at", "timestamp with time zone", "timestamptz", true},
		{"published_at", "timestamp with time zone", "timestamptz", false},
	}}
}

func severities(fs []Finding) (errs, warns int) {
	for _, f := range fs {
		switch f.Severity {
		case Error:
			errs++
		case Warn:
			warns++
		}
	}
	return errs, warns
}

func TestClassifyColumns(t *testing.T) {
	fs := classifyColumns(tgt, outboxColumns())
	if e, w := severities(fs); e+w != 0 {
		t.Fatalf("design schema: %+v", fs)
	}
	if last := fs[len(fs)-1]; !strings.Contains(last.Message, "headers, exchange, event_type") {
		t.Fatalf("absent optional columns not listed: %+v", last)
	}

	tf := outboxColumns()
	tf.columns[2].name = "body"
	fs = classifyColumns(tgt, tf)
	if e, _ := severities(fs); e != 1 || !strings.Contains(fs[2].Message, `message body column "payload" (CDCRELAY_PAYLOAD_COLUMN) is not in public.event_outbox`) {
		t.Fatalf("missing payload: %+v", fs)
	}

	tf = outboxColumns()
	tf.columns[2].typ, tf.columns[2].base = "bytea", "bytea"
	if e, _ := severities(classifyColumns(tgt, tf)); e != 1 {
		t.Fatal("bytea payload is not an error")
	}
	tf = outboxColumns()
	tf.columns[1].typ, tf.columns[1].base = "integer", "int4"
	if _, w := severities(classifyColumns(tgt, tf)); w != 1 {
		t.Fatal("integer routing key is not a warning")
	}
	tf = outboxColumns()
	tf.columns[0].notNull = false
	if _, w := severities(classifyColumns(tgt, tf)); w != 1 {
		t.Fatal("nullable id is not a warning")
	}
	// What check says of a NULL follows the decoder (internal/wal): a NULL
	// id stops the relay, a NULL routing key or payload is poison, parked
	// unless CDCRELAY_POISON=stop.
	tf = outboxColumns()
	tf.columns[1].notNull = false
	if fs := classifyColumns(tgt, tf); !strings.Contains(fs[1].Message, "is poison: it is parked") || strings.Contains(fs[1].Message, "stops") {
		t.Fatalf("nullable routing key, CDCRELAY_POISON=park: %q", fs[1].Message)
	}
	stop := tgt
	stop.poison = config.PoisonStop
	if fs := classifyColumns(stop, tf); !strings.Contains(fs[1].Message, "CDCRELAY_POISON=stop, stops the relay") {
		t.Fatalf("nullable routing key, CDCRELAY_POISON=stop: %q", fs[1].Message)
	}
	tf = outboxColumns()
	tf.columns[0].notNull = false
	if fs := classifyColumns(tgt, tf); !strings.Contains(fs[0].Message, "stops the relay") {
		t.Fatalf("nullable id: %q", fs[0].Message)
	}
	tf = outboxColumns()
	tf.columns = append(tf.columns[:4], column{"headers", "jsonb", "jsonb", false}, column{"exchange", "text", "text", false})
	fs = classifyColumns(tgt, tf)
	if e, w := severities(fs); e != 1 || w != 0 || !strings.Contains(strings.Join(messages(fs), "\n"), "headers: jsonb → AMQP headers") {
		t.Fatalf("no published_at / optional columns: %v", messages(fs))
	}
}

func messages(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Severity.String()+" "+f.Message)
	}
	return out
}

// published builds publication facts for outboxColumns (OID 10): covers
// lists the outbox; others are further tables (schema.table), kin those of
// them in the outbox's tree; set sets the rest.
func published(covers bool, others, kin []string, set func(*slot.PublicationFacts)) slot.PublicationFacts {
	p := slot.PublicationFacts{Exists: true, Insert: true, Kin: map[uint32]bool{}}
	if covers {
		p.Tables = append(p.Tables, slot.Relation{OID: 10, Schema: "public", Name: "event_outbox", Kind: "r"})
	}
	for i, name := range others {
		schema, table, _ := strings.Cut(name, ".")
		rel := slot.Relation{OID: uint32(100 + i), Schema: schema, Name: table, Kind: "r"}
		p.Tables = append(p.Tables, rel)
		p.Kin[rel.OID] = slices.Contains(kin, name)
	}
	if set != nil {
		set(&p)
	}
	return p
}

func TestClassifyPublication(t *testing.T) {
	good := published(true, nil, nil, nil)
	tf := outboxColumns()
	tf.oid = 10
	if fs := classifyPublication(tgt, tf, good); len(fs) != 1 || fs[0].Severity != OK {
		t.Fatal(fs)
	}
	for name, c := range map[string]struct {
		p       slot.PublicationFacts
		errs    int
		warns   int
		message string
	}{
		"missing":                     {slot.PublicationFacts{}, 1, 0, "does not exist"},
		"missing, ours":               {slot.PublicationFacts{CanCreate: true}, 0, 1, "the relay would create it"},
		"updates":                     {published(true, nil, nil, func(p *slot.PublicationFacts) { p.Update = true }), 0, 1, "also publishes update:"},
		"all ops":                     {published(true, nil, nil, func(p *slot.PublicationFacts) { p.Update, p.Delete, p.Truncate = true, true, true }), 0, 1, "update, delete, truncate: the relay works, but the walsender decodes every such change"},
		"all tables, only the outbox": {published(true, nil, nil, func(p *slot.PublicationFacts) { p.AllTables = true }), 1, 0, "is FOR ALL TABLES: the relay refuses it"},
		"no inserts":                  {published(true, nil, nil, func(p *slot.PublicationFacts) { p.Insert = false }), 1, 0, "does not publish inserts"},
		"other table":                 {published(false, nil, nil, nil), 1, 0, "does not cover public.event_outbox"},
		"also others":                 {published(true, []string{"public.a", "public.b"}, nil, nil), 0, 1, "also covers public.a, public.b, which is not the outbox: the relay skips its inserts"},
		"also a partition":            {published(true, []string{"public.a", "public.event_outbox_1"}, []string{"public.event_outbox_1"}, nil), 1, 0, "also covers public.event_outbox_1, of the partition or inheritance tree"},
		"all tables":                  {published(true, []string{"public.a", "public.b", "public.c", "public.d", "public.e", "public.f"}, nil, func(p *slot.PublicationFacts) { p.AllTables = true }), 1, 0, "every table (FOR ALL TABLES): public.a, public.b, public.c, public.d, public.e and 1 more"},
		"row filter":                  {published(true, nil, nil, func(p *slot.PublicationFacts) { p.RowFilter = "(routing_key <> 'x')" }), 0, 1, "WHERE (routing_key <> 'x')"},
		"column list":                 {published(true, nil, nil, func(p *slot.PublicationFacts) { p.Columns = []string{"id", "routing_key"} }), 1, 0, "leaves out payload"},
		"full list":                   {published(true, nil, nil, func(p *slot.PublicationFacts) { p.Columns = []string{"id", "routing_key", "payload", "published_at"} }), 0, 0, "publishes inserts only"},
	} {
		fs := classifyPublication(tgt, tf, c.p)
		e, w := severities(fs)
		if e != c.errs || w != c.warns || !strings.Contains(strings.Join(messages(fs), "\n"), c.message) {
			t.Errorf("%s: %d errors %d warnings, want %d %d with %q:\n%s", name, e, w, c.errs, c.warns, c.message, strings.Join(messages(fs), "\n"))
		}
		for _, f := range fs {
			if f.Severity != OK && f.Remedy == "" {
				t.Errorf("%s: no remedy: %+v", name, f)
			}
		}
	}
	part := tf
	part.kind = "p"
	if fs := classifyPublication(tgt, part, good); fs[0].Severity != Error || !strings.Contains(fs[0].Remedy, "publish_via_partition_root") {
		t.Fatal(fs)
	}
	// A misspelt CDCRELAY_TABLE: the remedy names the table the publication
	// does publish, never a publication of the missing one.
	typo := tgt
	typo.table = "event_outbx"
	if fs := classifyPublication(typo, tableFacts{}, published(false, []string{"public.event_outbox"}, nil, nil)); len(fs) != 1 ||
		fs[0].Severity != Error || strings.Contains(fs[0].Remedy, "ALTER PUBLICATION") ||
		!strings.Contains(fs[0].Remedy, "set CDCRELAY_TABLE to the table publication cdcrelay_outbox publishes (public.event_outbox)") {
		t.Fatalf("missing table: %+v", fs)
	}
	if fs := classifyPublication(tgt, tf, slot.PublicationFacts{}); !strings.Contains(fs[0].Remedy, "cdcrelay migrate") ||
		!strings.Contains(fs[0].Remedy, "CREATE PUBLICATION cdcrelay_outbox FOR TABLE public.event_outbox WITH (publish = 'insert');") {
		t.Fatal(fs)
	}
}

func TestClassifySlot(t *testing.T) {
	ok := slotFacts{Info: slot.Info{Exists: true, Type: "logical", Plugin: "pgoutput", Database: "app", CurrentDatabase: "app", WALStatus: "reserved", Retained: "56 bytes"}}
	lostSlot := func(s *slotFacts) { s.WALStatus, s.Lost, s.Invalidation = "lost", true, "wal_status lost" }
	for name, c := range map[string]struct {
		s       slotFacts
		want    Severity
		message string
	}{
		"missing":        {slotFacts{}, OK, "does not exist yet: the relay creates it"},
		"missing no pub": {slotFacts{publicationMissing: true}, OK, "needs the publication first"},
		"good":           {ok, OK, "exists (pgoutput, database app, wal_status reserved, retaining 56 bytes of WAL)"},
		"active":         {with(ok, func(s *slotFacts) { s.Active, s.ActivePID = true, 42 }), OK, "another relay is streaming (hot standby will wait)"},
		"plugin":         {with(ok, func(s *slotFacts) { s.Plugin = "test_decoding" }), Error, "plugin test_decoding"},
		"physical":       {with(ok, func(s *slotFacts) { s.Type, s.Plugin, s.Database = "physical", "", "" }), Error, "physical slot"},
		"other db":       {with(ok, func(s *slotFacts) { s.Database = "billing" }), Error, "belongs to database billing"},
		"lost":           {with(ok, lostSlot), Error, "wal_status lost"},
		"unreserved":     {with(ok, func(s *slotFacts) { s.WALStatus = "unreserved" }), Warn, "about to pass max_slot_wal_keep_size"},
		"temporary":      {with(ok, func(s *slotFacts) { s.Temporary = true }), Error, "temporary"},
	} {
		f := classifySlot(tgt, c.s)
		if f.Severity != c.want || !strings.Contains(f.Message, c.message) || (f.Severity != OK && f.Remedy == "") {
			t.Errorf("%s: %v %q (remedy %q), want %v with %q", name, f.Severity, f.Message, f.Remedy, c.want, c.message)
		}
	}
	// A lost slot stops the relay only with CDCRELAY_SLOT_LOST=stop; with
	// recreate (the default) run recreates it, so check warns.
	lost := with(ok, lostSlot)
	for policy, want := range map[string]Severity{config.SlotLostStop: Error, config.SlotLostRecreate: Warn} {
		tg := tgt
		tg.slotLost = policy
		if f := classifySlot(tg, lost); f.Severity != want || !strings.Contains(f.Message, "CDCRELAY_SLOT_LOST="+policy) || f.Remedy == "" {
			t.Errorf("lost slot, CDCRELAY_SLOT_LOST=%s: %v %q, want %v", policy, f.Severity, f.Message, want)
		}
	}
}

func with(s slotFacts, f func(*slotFacts)) slotFacts { f(&s); return s }

func TestQuoteIdent(t *testing.T) {
	for in, want := range map[string]string{"relay": "relay", "user": `"user"`, "Relay": `"Relay"`, `a"b`: `"a""b"`, "svc-1": `"svc-1"`} {
		if got := quoteIdent(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

func TestPublicationNames(t *testing.T) {
	for q, want := range map[string]string{
		`START_REPLICATION SLOT "b" LOGICAL 0/0 (proto_version '1', publication_names '"cdcrelay_outbox"')`:       "cdcrelay_outbox",
		`START_REPLICATION SLOT b LOGICAL 0/0 (proto_version '1', publication_names 'Pub_A, "My ""Pub""", x''y')`: `pub_a|My "Pub"|x'y`,
		`<insufficient privilege>`: "",
	} {
		if got := strings.Join(publicationNames(q), "|"); got != want {
			t.Errorf("%s: %q, want %q", q, got, want)
		}
	}
}

// TestClassifyEncoding: a real encoding is fine (PostgreSQL converts it to
// the relay's UTF-8), SQL_ASCII is a warning, MULE_INTERNAL an error.
func TestClassifyEncoding(t *testing.T) {
	for enc, want := range map[string]Severity{"UTF8": OK, "LATIN1": OK, "WIN1252": OK, "SQL_ASCII": Warn, "MULE_INTERNAL": Error} {
		if f := classifyEncoding(enc); f.Severity != want || (want != OK && f.Remedy == "") {
			t.Errorf("%s: %v %q (remedy %q), want %v with a remedy", enc, f.Severity, f.Message, f.Remedy, want)
		}
	}
}
