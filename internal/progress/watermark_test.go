package progress

import (
	"math/rand/v2"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// op is one step of a scripted stream: b=begin, e=event, c=commit(lsn),
// k=keepalive(lsn), a=ack(seq).
type op struct {
	kind byte
	arg  uint64
}

func TestWatermark(t *testing.T) {
	tests := []struct {
		name string
		ops  []op
		want []pglogrepl.LSN // Position after each op
	}{
		{
			name: "single transaction advances only when its event is acked",
			ops:  []op{{'b', 0}, {'e', 0}, {'c', 200}, {'a', 0}},
			want: []pglogrepl.LSN{100, 100, 100, 200},
		},
		{
			name: "acks out of order hold until the gap closes",
			ops: []op{
				{'b', 0}, {'e', 0}, {'e', 0}, {'c', 200},
				{'b', 0}, {'e', 0}, {'c', 300},
				{'a', 2}, {'a', 1}, {'a', 0},
			},
			want: []pglogrepl.LSN{100, 100, 100, 100, 100, 100, 100, 100, 100, 300},
		},
		{
			name: "partially acked second transaction stops at the first",
			ops: []op{
				{'b', 0}, {'e', 0}, {'c', 200},
				{'b', 0}, {'e', 0}, {'e', 0}, {'c', 300},
				{'a', 0}, {'a', 2},
			},
			want: []pglogrepl.LSN{100, 100, 100, 100, 100, 100, 100, 200, 200},
		},
		{
			name: "keepalive with nothing in flight is confirmed at once",
			ops:  []op{{'k', 500}},
			want: []pglogrepl.LSN{500},
		},
		{
			name: "keepalive queues behind in-flight events",
			ops:  []op{{'b', 0}, {'e', 0}, {'c', 200}, {'k', 500}, {'a', 0}},
			want: []pglogrepl.LSN{100, 100, 100, 100, 500},
		},
		{
			name: "keepalive inside an open transaction is dropped",
			ops:  []op{{'b', 0}, {'e', 0}, {'k', 500}, {'a', 0}, {'c', 300}},
			want: []pglogrepl.LSN{100, 100, 100, 100, 300},
		},
		{
			name: "empty transaction advances when nothing is in flight",
			ops:  []op{{'b', 0}, {'c', 250}},
			want: []pglogrepl.LSN{100, 250},
		},
		{
			name: "never goes backwards",
			ops:  []op{{'k', 500}, {'b', 0}, {'c', 300}, {'k', 400}},
			want: []pglogrepl.LSN{500, 500, 500, 500},
		},
		{
			name: "duplicate and stale acks are harmless",
			ops:  []op{{'b', 0}, {'e', 0}, {'e', 0}, {'c', 200}, {'a', 0}, {'a', 0}, {'a', 1}},
			want: []pglogrepl.LSN{100, 100, 100, 100, 100, 100, 200},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := NewWatermark(100)
			for i, o := range tt.ops {
				switch o.kind {
				case 'b':
					w.Begin()
				case 'e':
					w.NextSeq()
				case 'c':
					w.Commit(pglogrepl.LSN(o.arg))
				case 'k':
					w.Keepalive(pglogrepl.LSN(o.arg))
				case 'a':
					w.ack(o.arg, placed{})
				}
				if got := w.Position(); got != tt.want[i] {
					t.Fatalf("after op %d (%c %d): position %d, want %d", i, o.kind, o.arg, got, tt.want[i])
				}
			}
		})
	}
}

// TestWatermarkRandomAckOrder streams random transactions, acks their events
// in a random order and checks after every ack that the position is exactly
// the end of the newest transaction whose events and all earlier ones are
// acked, and that it never decreases.
func TestWatermarkRandomAckOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		w := NewWatermark(0)
		type txn struct {
			last uint64 // seq after its last event
			end  pglogrepl.LSN
		}
		var txns []txn
		lsn := pglogrepl.LSN(1000)
		for range 1 + rng.IntN(20) {
			w.Begin()
			for range rng.IntN(5) {
				w.NextSeq()
			}
			lsn += pglogrepl.LSN(1 + rng.IntN(100))
			w.Commit(lsn)
			txns = append(txns, txn{last: uint64(w.Pending()) + ackedCount(w), end: lsn})
		}
		total := ackedCount(w) + uint64(w.Pending())
		acked := make([]bool, total)
		var prev pglogrepl.LSN
		for _, seq := range rng.Perm(int(total)) {
			w.ack(uint64(seq), placed{})
			acked[seq] = true
			contiguous := uint64(0)
			for contiguous < total && acked[contiguous] {
				contiguous++
			}
			var want pglogrepl.LSN
			for _, tx := range txns {
				if tx.last <= contiguous {
					want = tx.end
				}
			}
			got := w.Position()
			if got != want {
				t.Fatalf("round %d: position %d, want %d (contiguous acks %d of %d)", round, got, want, contiguous, total)
			}
			if got < prev {
				t.Fatalf("round %d: position went back from %d to %d", round, prev, got)
			}
			prev = got
		}
		if total > 0 && w.Position() != lsn {
			t.Fatalf("round %d: all acked, position %d, want %d", round, w.Position(), lsn)
		}
	}
}

func ackedCount(w *Watermark) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acked
}

func TestWatermarkBoundedMarks(t *testing.T) {
	w := NewWatermark(0)
	w.Begin()
	w.NextSeq()
	w.Commit(10)
	for i := range 10000 {
		w.Keepalive(pglogrepl.LSN(20 + i))
	}
	if n := len(w.boundaries); n != 1 {
		t.Fatalf("keepalives behind one in-flight event left %d marks, want 1 (all share one sequence number)", n)
	}
	w.ack(0, placed{})
	if got := w.Position(); got != 20+9999 {
		t.Fatalf("position %d, want %d", got, 20+9999)
	}
}

// TestWatermarkDone: Done names the newest event of the acked prefix that
// was acked with its place, inside a transaction too, and never an event
// behind a gap.
func TestWatermarkDone(t *testing.T) {
	w := NewWatermark(100)
	if _, _, ok := w.Done(); ok {
		t.Fatal("Done before any ack")
	}
	w.Begin()
	seqs := []uint64{w.NextSeq(), w.NextSeq(), w.NextSeq(), w.NextSeq()}
	place := func(i int) wal.Place { return wal.Place{CommitLSN: 150, Index: i} }
	w.MarkDone(seqs[1], place(1), "b") // behind a gap: not done yet
	if _, _, ok := w.Done(); ok {
		t.Fatal("Done with event 0 unacked")
	}
	w.MarkDone(seqs[0], place(0), "a")
	if at, id, ok := w.Done(); !ok || at != place(1) || id != "b" {
		t.Fatalf("Done = %v %q %v, want %v b", at, id, ok, place(1))
	}
	w.ack(seqs[2], placed{}) // acked without a place: the prefix grows, Done stays at b
	if at, _, _ := w.Done(); at != place(1) {
		t.Fatalf("Done = %v after a placeless ack, want %v", at, place(1))
	}
	w.MarkDone(seqs[3], place(3), "d")
	if at, id, _ := w.Done(); at != place(3) || id != "d" {
		t.Fatalf("Done = %v %q, want %v d", at, id, place(3))
	}
	if w.Position() != 100 {
		t.Fatalf("position %s moved inside an open transaction", w.Position())
	}
}
