package wal

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

var testMapping = Mapping{Outbox: config.Outbox{
	Schema: "public", Table: "event_outbox",
	IDColumn: "id", RoutingKeyColumn: "routing_key", PayloadColumn: "payload",
	HeadersColumn: "headers", ExchangeColumn: "exchange", TypeColumn: "event_type",
}}

var outboxCols = []string{"id", "routing_key", "payload", "enqueued_at", "published_at", "attempts", "last_error"}

func row(id, key, payload string) []*string {
	return []*string{s(id), s(key), s(payload), s("2026-01-01"), nil, s("0"), nil}
}

func TestDecoder(t *testing.T) {
	tests := []struct {
		name    string
		msgs    [][]byte
		want    []stepKind // kind of each step
		wantErr error      // error expected from the last message
		check   func(*testing.T, []step)
	}{
		{
			name: "one event",
			msgs: [][]byte{
				encBegin(0x500, 7), encRelation(1, "public", "event_outbox", outboxCols...),
				encInsert(1, row("a1", "orders.created", `{"x":1}`)...), encCommit(0x500, 0x530),
			},
			want: []stepKind{stepBegin, stepNone, stepEvent, stepCommit},
			check: func(t *testing.T, steps []step) {
				ev := steps[2].Event
				if ev.ID != "a1" || ev.RoutingKey != "orders.created" || string(ev.Payload) != `{"x":1}` {
					t.Fatalf("event %+v", ev)
				}
				if ev.CommitLSN != 0x500 || ev.Index != 0 {
					t.Fatalf("commit lsn %s index %d", ev.CommitLSN, ev.Index)
				}
				if ev.PayloadIsJSON {
					t.Fatal("a text payload column flagged as JSON")
				}
				if steps[3].Commit.TransactionEndLSN != pglogrepl.LSN(0x530) {
					t.Fatalf("end lsn %s", steps[3].Commit.TransactionEndLSN)
				}
			},
		},
		{
			name: "events are numbered within their transaction",
			msgs: [][]byte{
				encBegin(0x500, 7), encRelation(1, "public", "event_outbox", outboxCols...),
				encInsert(1, row("a1", "k", `{}`)...), encInsert(1, row("a2", "k", `{}`)...), encCommit(0x500, 0x530),
				encBegin(0x600, 8), encInsert(1, row("a3", "k", `{}`)...), encCommit(0x600, 0x630),
			},
			want: []stepKind{stepBegin, stepNone, stepEvent, stepEvent, stepCommit, stepBegin, stepEvent, stepCommit},
			check: func(t *testing.T, steps []step) {
				if steps[2].Event.Index != 0 || steps[3].Event.Index != 1 || steps[6].Event.Index != 0 {
					t.Fatalf("indexes %d %d %d", steps[2].Event.Index, steps[3].Event.Index, steps[6].Event.Index)
				}
			},
		},
		{
			name: "columns are mapped by name in any order, optional ones used",
			msgs: [][]byte{
				encBegin(0x500, 7),
				encRelation(1, "public", "event_outbox", "payload", "exchange", "id", "headers", "routing_key", "event_type"),
				encInsert(1, s(`{}`), s("ex1"), s("id9"), s(`{"h":"v"}`), s("rk"), s("T")),
				encCommit(0x500, 0x530),
			},
			want: []stepKind{stepBegin, stepNone, stepEvent, stepCommit},
			check: func(t *testing.T, steps []step) {
				ev := steps[2].Event
				if ev.ID != "id9" || ev.RoutingKey != "rk" || ev.Exchange != "ex1" || string(ev.Headers) != `{"h":"v"}` || ev.Type != "T" {
					t.Fatalf("event %+v", ev)
				}
			},
		},
		{
			name: "a re-sent relation with a new column replaces the cached one",
			msgs: [][]byte{
				encBegin(0x500, 7), encRelation(1, "public", "event_outbox", "id", "routing_key", "payload"),
				encInsert(1, s("a"), s("k"), s("{}")),
				encRelation(1, "public", "event_outbox", "extra", "id", "routing_key", "payload"),
				encInsert(1, s("x"), s("b"), s("k2"), s("{}")), encCommit(0x500, 0x530),
			},
			want: []stepKind{stepBegin, stepNone, stepEvent, stepNone, stepEvent, stepCommit},
			check: func(t *testing.T, steps []step) {
				if steps[4].Event.ID != "b" || steps[4].Event.RoutingKey != "k2" {
					t.Fatalf("event after relation change %+v", steps[4].Event)
				}
			},
		},
		{
			name: "relations of other tables and ignored messages produce nothing",
			msgs: [][]byte{
				encBegin(0x500, 7), encRelation(2, "public", "orders", "id"),
				{'U'}, {'D'}, {'T'}, {'Y'}, {'O'}, {'M'}, encCommit(0x500, 0x530),
			},
			want: []stepKind{stepBegin, stepNone, stepNone, stepNone, stepNone, stepNone, stepNone, stepNone, stepCommit},
		},
		{
			// Never skipped unless known foreign: the commit after it must
			// not be confirmed.
			name:    "a row of an unknown table ends the session",
			msgs:    [][]byte{encBegin(0x500, 7), encRelation(2, "public", "orders", "id"), encInsert(2, s("1"))},
			want:    []stepKind{stepBegin, stepNone},
			wantErr: ErrRelationUnknown,
		},
		{
			name:    "missing required column",
			msgs:    [][]byte{encBegin(1, 1), encRelation(1, "public", "event_outbox", "id", "payload"), encInsert(1, s("a"), s("{}"))},
			want:    []stepKind{stepBegin, stepNone},
			wantErr: ErrSchema,
		},
		{
			name: "NULL routing key or payload is a poison event, not a stream error",
			msgs: [][]byte{
				encBegin(1, 1), encRelation(1, "public", "event_outbox", "id", "routing_key", "payload"),
				encInsert(1, s("a"), nil, s("{}")), encInsert(1, s("b"), s("k"), nil), encInsert(1, s("c"), s("k"), s("{}")),
			},
			want: []stepKind{stepBegin, stepNone, stepEvent, stepEvent, stepEvent},
			check: func(t *testing.T, steps []step) {
				if p := steps[2].Event.Problem; p != `column "routing_key" is NULL` || steps[2].Event.ID != "a" {
					t.Fatalf("problem %q", p)
				}
				if p := steps[3].Event.Problem; p != `column "payload" is NULL` {
					t.Fatalf("problem %q", p)
				}
				if p := steps[4].Event.Problem; p != "" {
					t.Fatalf("problem %q on a good row", p)
				}
			},
		},
		{
			name:    "NULL id stops the stream",
			msgs:    [][]byte{encBegin(1, 1), encRelation(1, "public", "event_outbox", "id", "routing_key", "payload"), encInsert(1, nil, s("k"), s("{}"))},
			want:    []stepKind{stepBegin, stepNone},
			wantErr: ErrSchema,
		},
		{
			name:    "insert before its relation",
			msgs:    [][]byte{encBegin(1, 1), encInsert(1, s("a"))},
			want:    []stepKind{stepBegin},
			wantErr: ErrSchema,
		},
		{
			name:    "commit without begin",
			msgs:    [][]byte{encCommit(1, 2)},
			wantErr: ErrProtocol,
		},
		{
			name:    "nested begin",
			msgs:    [][]byte{encBegin(1, 1), encBegin(2, 2)},
			want:    []stepKind{stepBegin},
			wantErr: ErrProtocol,
		},
		{
			name:    "truncated insert",
			msgs:    [][]byte{encBegin(1, 1), encRelation(1, "public", "event_outbox", "id"), encInsert(1, s("abcdef"))[:12]},
			want:    []stepKind{stepBegin, stepNone},
			wantErr: ErrMalformed,
		},
	}
	for _, unsupported := range []byte{'S', 'E', 'c', 'A', 'b', 'P', 'K', 'r', 'p', 'Z'} {
		tests = append(tests, struct {
			name    string
			msgs    [][]byte
			want    []stepKind
			wantErr error
			check   func(*testing.T, []step)
		}{name: "unsupported " + string(unsupported), msgs: [][]byte{encBegin(1, 1), {unsupported, 0, 0, 0, 1}}, want: []stepKind{stepBegin}, wantErr: ErrUnsupported})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder(testMapping)
			var steps []step
			for i, m := range tt.msgs {
				step, err := d.Decode(m)
				if err != nil {
					if tt.wantErr == nil || i != len(tt.msgs)-1 {
						t.Fatalf("message %d: unexpected error %v", i, err)
					}
					if !errors.Is(err, tt.wantErr) {
						t.Fatalf("error %v, want %v", err, tt.wantErr)
					}
					break
				}
				if tt.wantErr != nil && i == len(tt.msgs)-1 {
					t.Fatalf("no error, want %v", tt.wantErr)
				}
				steps = append(steps, step)
			}
			if len(steps) != len(tt.want) {
				t.Fatalf("%d steps, want %d", len(steps), len(tt.want))
			}
			for i := range steps {
				if steps[i].Kind != tt.want[i] {
					t.Fatalf("step %d kind %d, want %d", i, steps[i].Kind, tt.want[i])
				}
			}
			if tt.check != nil {
				tt.check(t, steps)
			}
		})
	}
}

// TestDecoderOutboxIdentity: with the table's OID resolved, the outbox is
// known by it. A rename or move mid-stream (the same OID under a new name)
// is followed and reported once; another relation's row, even one under
// the configured name, stops the stream with ErrNotOutbox.
func TestDecoderOutboxIdentity(t *testing.T) {
	m := testMapping
	m.OID = 16400
	cols := []string{"id", "routing_key", "payload"}
	tests := []struct {
		name    string
		msgs    [][]byte
		want    []stepKind
		notices []int // steps that carry a notice
		wantErr error
	}{
		{
			name: "the configured table",
			msgs: [][]byte{encBegin(1, 1), encRelation(16400, "public", "event_outbox", cols...), encInsert(16400, s("a"), s("k"), s("{}")), encCommit(1, 2)},
			want: []stepKind{stepBegin, stepNone, stepEvent, stepCommit},
		},
		{
			name: "renamed, then moved: followed, reported once",
			msgs: [][]byte{
				encBegin(1, 1), encRelation(16400, "public", "event_outbox", cols...), encInsert(16400, s("a"), s("k"), s("{}")), encCommit(1, 2),
				encBegin(3, 2), encRelation(16400, "public", "outbox_v2", cols...), encInsert(16400, s("b"), s("k"), s("{}")), encCommit(3, 4),
				encBegin(5, 3), encRelation(16400, "archive", "outbox_v2", cols...), encInsert(16400, s("c"), s("k"), s("{}")), encCommit(5, 6),
			},
			want:    []stepKind{stepBegin, stepNone, stepEvent, stepCommit, stepBegin, stepNone, stepEvent, stepCommit, stepBegin, stepNone, stepEvent, stepCommit},
			notices: []int{5},
		},
		{
			name:    "another relation under the configured name",
			msgs:    [][]byte{encBegin(1, 1), encRelation(16500, "public", "event_outbox", cols...), encInsert(16500, s("a"), s("k"), s("{}"))},
			want:    []stepKind{stepBegin, stepNone},
			wantErr: ErrNotOutbox,
		},
		{
			// Not known at session start: the next start classifies it
			// (and refuses a partition of the outbox).
			name:    "a partition published under its own name",
			msgs:    [][]byte{encBegin(1, 1), encRelation(16401, "public", "event_outbox_2026", cols...), encInsert(16401, s("a"), s("k"), s("{}"))},
			want:    []stepKind{stepBegin, stepNone},
			wantErr: ErrRelationUnknown,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDecoder(m)
			var steps []step
			var err error
			for _, msg := range tt.msgs {
				var step step
				if step, err = d.Decode(msg); err != nil {
					break
				}
				steps = append(steps, step)
			}
			if !errors.Is(err, tt.wantErr) || (errors.Is(err, ErrRelationUnknown) == errors.Is(err, ErrSchema) && err != nil) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if len(steps) != len(tt.want) {
				t.Fatalf("%d steps, want %d", len(steps), len(tt.want))
			}
			var notices []int
			for i, st := range steps {
				if st.Kind != tt.want[i] {
					t.Fatalf("step %d kind %d, want %d", i, st.Kind, tt.want[i])
				}
				if st.Notice != "" {
					notices = append(notices, i)
				}
			}
			if len(notices) != len(tt.notices) || (len(notices) > 0 && notices[0] != tt.notices[0]) {
				t.Fatalf("notices at steps %v, want %v", notices, tt.notices)
			}
			if len(notices) > 0 && !strings.Contains(steps[notices[0]].Notice, `set CDCRELAY_TABLE="public"."outbox_v2"`) {
				t.Fatalf("notice %q names no remedy", steps[notices[0]].Notice)
			}
		})
	}
}

// TestDecoderCopiesValues: the replication buffer is reused by the next
// receive, so an event must not alias it.
func TestDecoderCopiesValues(t *testing.T) {
	d := NewDecoder(testMapping)
	for _, m := range [][]byte{encBegin(1, 1), encRelation(1, "public", "event_outbox", "id", "routing_key", "payload", "headers")} {
		if _, err := d.Decode(m); err != nil {
			t.Fatal(err)
		}
	}
	buf := encInsert(1, s("a"), s("k"), s(`{"p":1}`), s(`{"h":1}`))
	step, err := d.Decode(buf)
	if err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] = 'X'
	}
	if string(step.Event.Payload) != `{"p":1}` || string(step.Event.Headers) != `{"h":1}` || step.Event.ID != "a" {
		t.Fatalf("event changed with the buffer: %+v", step.Event)
	}
}

// FuzzDecode feeds arbitrary bytes after a valid prefix: the decoder must
// never panic, and whatever it accepts must be consistent.
func FuzzDecode(f *testing.F) {
	for _, seed := range [][]byte{
		encBegin(0x500, 7), encCommit(0x500, 0x530),
		encRelation(1, "public", "event_outbox", outboxCols...),
		encInsert(1, row("a1", "k", `{"x":1}`)...),
		encInsert(1, s("a"), nil, s("{}")),
		encInsert(2, s("1")), encRelation(2, "public", "event_outbox", outboxCols...), encRelation(3, "public", "invoices", "id"),
		{'S', 0, 0, 0, 1}, {'R'}, {'I', 0, 0, 0, 1, 'N', 0xff, 0xff},
	} {
		f.Add(seed)
	}
	// Relation 2 is known foreign: its inserts are skipped.
	m := testMapping
	m.Foreign = map[uint32]string{2: `"public"."orders"`}
	f.Fuzz(func(t *testing.T, data []byte) {
		d := NewDecoder(m)
		for _, m := range [][]byte{encBegin(0x500, 7), encRelation(1, "public", "event_outbox", outboxCols...), encRelation(2, "public", "orders", "id")} {
			if _, err := d.Decode(m); err != nil {
				t.Fatal(err)
			}
		}
		step, err := d.Decode(data)
		if err != nil {
			if !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrSchema) && !errors.Is(err, ErrProtocol) && !errors.Is(err, ErrRelationUnknown) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if step.Skipped && step.Kind != stepNone {
			t.Fatalf("a skipped insert produced %+v", step)
		}
		if step.Kind == stepEvent && (step.Event.CommitLSN != 0x500 || (step.Event.Payload == nil && step.Event.Problem == "")) {
			t.Fatalf("event without its transaction's position or payload: %+v", step.Event)
		}
		// The parser must agree with pglogrepl on messages both accept.
		if len(data) > 0 && (data[0] == 'B' || data[0] == 'C') {
			if _, perr := pglogrepl.Parse(data); perr != nil {
				t.Fatalf("pglogrepl rejects a message we accepted: %v", perr)
			}
		}
	})
}
