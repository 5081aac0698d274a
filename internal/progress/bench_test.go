package progress

import (
	"testing"

	"github.com/jackc/pglogrepl"
)

// BenchmarkWatermark is the watermark's share of each event: the reader
// records Begin, Event and Commit, the confirm loop acks, and the reader
// reads Position for its status updates. One iteration is one event.
//
//   - 1 per tx, in order: every event commits alone and acks arrive in
//     publish order (one channel, the common case).
//   - 10 per tx, in order: ten events per transaction.
//   - 1000 in flight, reversed acks: a window of 1,000 events whose acks
//     arrive newest first, the worst order for the early-ack set.
func BenchmarkWatermark(b *testing.B) {
	b.Run("1 per tx, in order", func(b *testing.B) {
		w := NewWatermark(0)
		lsn := pglogrepl.LSN(0x1000)
		b.ReportAllocs()
		for b.Loop() {
			w.Begin()
			seq := w.NextSeq()
			lsn += 0x100
			w.Commit(lsn)
			w.ack(seq, placed{})
			_ = w.Position()
		}
	})
	b.Run("10 per tx, in order", func(b *testing.B) {
		w := NewWatermark(0)
		lsn := pglogrepl.LSN(0x1000)
		var seqs [10]uint64
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			k := i % 10
			if k == 0 {
				w.Begin()
			}
			seqs[k] = w.NextSeq()
			if k == 9 {
				lsn += 0x1000
				w.Commit(lsn)
				for _, s := range seqs {
					w.ack(s, placed{})
				}
				_ = w.Position()
			}
		}
	})
	b.Run("1000 in flight, reversed acks", func(b *testing.B) {
		const window = 1000
		w := NewWatermark(0)
		lsn := pglogrepl.LSN(0x1000)
		seqs := make([]uint64, 0, window)
		b.ReportAllocs()
		for b.Loop() {
			w.Begin()
			seqs = append(seqs, w.NextSeq())
			lsn += 0x100
			w.Commit(lsn)
			if len(seqs) == window {
				for i := len(seqs) - 1; i >= 0; i-- {
					w.ack(seqs[i], placed{})
				}
				_ = w.Position()
				seqs = seqs[:0]
			}
		}
	})
}
