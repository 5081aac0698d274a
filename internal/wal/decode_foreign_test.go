package wal

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestDecoderForeignRelations: with the foreign relations of the
// publication known at session start, their inserts are skipped (noticed
// once per relation, counted by Skipped) and the outbox's rows around
// them keep their places; the outbox's name under another OID still
// stops the relay (ErrNotOutbox, fatal), and a relation unknown at
// session start ends the session with ErrRelationUnknown, which is not
// ErrSchema (the relay retries and classifies it then).
func TestDecoderForeignRelations(t *testing.T) {
	m := testMapping
	m.OID = 16400
	m.Foreign = map[uint32]string{16600: `"public"."orders"`, 16601: `"shop"."carts"`}
	cols := []string{"id", "routing_key", "payload"}
	outbox := encRelation(16400, "public", "event_outbox", cols...)
	event := func(id string) []byte { return encInsert(16400, s(id), s("k"), s("{}")) }
	tests := []struct {
		name    string
		msgs    [][]byte
		want    []stepKind
		skipped []int // steps skipped
		notices []int // steps that carry a notice
		wantErr error
	}{
		{
			name: "foreign inserts skipped around the outbox's, noticed once per relation",
			msgs: [][]byte{
				encBegin(1, 1), outbox, encRelation(16600, "public", "orders", "id"), event("a"), encInsert(16600, s("1")), event("b"), encCommit(1, 2),
				encBegin(3, 2), encInsert(16600, s("2")), encRelation(16601, "shop", "carts", "id"), encInsert(16601, s("3")),
				encRelation(16600, "public", "orders", "id"), encInsert(16600, s("4")), event("c"), encCommit(3, 4),
			},
			want: []stepKind{
				stepBegin, stepNone, stepNone, stepEvent, stepNone, stepEvent, stepCommit,
				stepBegin, stepNone, stepNone, stepNone, stepNone, stepNone, stepEvent, stepCommit,
			},
			skipped: []int{4, 8, 10, 12},
			notices: []int{4, 10},
		},
		{
			name:    "a foreign relation renamed to the outbox's name",
			msgs:    [][]byte{encBegin(1, 1), encRelation(16600, "public", "event_outbox", cols...), encInsert(16600, s("a"), s("k"), s("{}"))},
			want:    []stepKind{stepBegin, stepNone},
			wantErr: ErrNotOutbox,
		},
		{
			name:    "the outbox created again under its name",
			msgs:    [][]byte{encBegin(1, 1), outbox, event("a"), encRelation(16700, "public", "event_outbox", cols...), encInsert(16700, s("b"), s("k"), s("{}"))},
			want:    []stepKind{stepBegin, stepNone, stepEvent, stepNone},
			wantErr: ErrNotOutbox,
		},
		{
			name:    "a table added to the publication after the start",
			msgs:    [][]byte{encBegin(1, 1), outbox, event("a"), encRelation(16800, "public", "invoices", "id"), encInsert(16800, s("1"))},
			want:    []stepKind{stepBegin, stepNone, stepEvent, stepNone},
			wantErr: ErrRelationUnknown,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			steps, err := decodeAll(NewDecoder(m), tt.msgs)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			checkForeignSteps(t, steps, tt.want, tt.skipped, tt.notices)
			checkForeignErr(t, err)
		})
	}
}

func decodeAll(d *Decoder, msgs [][]byte) ([]step, error) {
	var steps []step
	for _, msg := range msgs {
		step, err := d.Decode(msg)
		if err != nil {
			return steps, err
		}
		steps = append(steps, step)
	}
	return steps, nil
}

func checkForeignSteps(t *testing.T, steps []step, want []stepKind, skipped, notices []int) {
	t.Helper()
	if len(steps) != len(want) {
		t.Fatalf("%d steps, want %d", len(steps), len(want))
	}
	var gotSkipped, gotNotices []int
	index := 0
	for i, st := range steps {
		if st.Kind != want[i] {
			t.Fatalf("step %d kind %d, want %d", i, st.Kind, want[i])
		}
		if st.Skipped {
			gotSkipped = append(gotSkipped, i)
		}
		if st.Notice != "" {
			gotNotices = append(gotNotices, i)
			if !strings.Contains(st.Notice, "skipping inserts into ") || !strings.Contains(st.Notice, "not the outbox table") {
				t.Fatalf("notice %q", st.Notice)
			}
		}
		switch st.Kind {
		case stepEvent:
			if st.Event.Index != index {
				t.Fatalf("step %d: event index %d, want %d (a skipped insert takes no place)", i, st.Event.Index, index)
			}
			index++
		case stepCommit:
			index = 0
		}
	}
	if !slices.Equal(gotSkipped, skipped) || !slices.Equal(gotNotices, notices) {
		t.Fatalf("skipped at %v, notices at %v; want %v, %v", gotSkipped, gotNotices, skipped, notices)
	}
}

// checkForeignErr: ErrNotOutbox is fatal (ErrSchema); ErrRelationUnknown
// is not, and names the relation for the next start to classify.
func checkForeignErr(t *testing.T, err error) {
	t.Helper()
	var unknown *RelationUnknownError
	switch {
	case errors.Is(err, ErrNotOutbox) && !strings.Contains(err.Error(), "public.event_outbox"):
		t.Fatalf("%v does not name the relation", err)
	case errors.Is(err, ErrRelationUnknown) && errors.Is(err, ErrSchema):
		t.Fatalf("%v is ErrSchema (fatal)", err)
	case errors.Is(err, ErrRelationUnknown) && (!errors.As(err, &unknown) || unknown.OID != 16800 || unknown.Name != "public.invoices"):
		t.Fatalf("%v: want relation 16800 public.invoices", err)
	}
}
