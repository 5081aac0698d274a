// Package progress records how far a session's events are done: the
// contiguous watermark that turns the broker's confirms, once their rows
// are marked, into the position the replication slot may move to.
package progress

import (
	"sync"

	"github.com/jackc/pglogrepl"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// Watermark ties broker confirms to the slot position. The WAL reader
// records, in stream order, each event (NextSeq), each transaction
// boundary (Begin, Commit) and each idle keepalive (Keepalive); the
// janitor's session marks events done (MarkDone) in any order, once the broker has
// confirmed them and their rows are marked (invariant 10, docs/architecture.md). Position
// returns the end LSN of the newest transaction whose events, and all
// events before them, are acknowledged.
//
// Invariants (see docs/architecture.md, 1 and 2):
//   - a boundary (commit or keepalive LSN) is released only when every
//     event with a lower sequence number has been acked;
//   - a keepalive LSN is recorded only when no transaction is open, so it
//     can never skip a transaction that is being streamed;
//   - Position never decreases.
//
// All methods are safe for concurrent use: the reader, the confirm loops
// and the janitor call them from different goroutines.
type Watermark struct {
	mu         sync.Mutex
	next       uint64            // sequence number of the next event
	acked      uint64            // every event with seq < acked is acknowledged
	early      map[uint64]placed // acked events with seq > acked, waiting for the gap to close
	boundaries []boundary        // positions waiting to be confirmed, in stream order
	open       bool              // a Begin has been seen without its Commit
	position   pglogrepl.LSN
	// done is the place of the newest event of the acked prefix that was
	// done with its place (MarkDone): it and every event before it are done.
	done placed
}

// placed is an acked event's place in the stream and id, when known.
type placed struct {
	at  wal.Place
	id  string
	set bool
}

// boundary is a position (a commit's end or a keepalive's WAL end) that
// may be confirmed once all events before seq are acked.
type boundary struct {
	seq uint64
	lsn pglogrepl.LSN
}

// NewWatermark starts at the slot's confirmed position.
func NewWatermark(start pglogrepl.LSN) *Watermark {
	return &Watermark{position: start, early: make(map[uint64]placed)}
}

// Begin records that a transaction opened.
func (w *Watermark) Begin() {
	w.mu.Lock()
	w.open = true
	w.mu.Unlock()
}

// NextSeq assigns the next sequence number to an event of the open transaction.
func (w *Watermark) NextSeq() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	seq := w.next
	w.next++
	return seq
}

// Commit records the end of the open transaction: end may be confirmed once
// every event recorded so far is acked.
func (w *Watermark) Commit(end pglogrepl.LSN) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.open = false
	w.addBoundary(end)
}

// Keepalive records the server's WAL end from a keepalive. Everything the
// server decoded before it has reached us, so it may be confirmed behind the
// events already recorded, unless a transaction is open: then it is dropped
// and a later keepalive or the commit will carry the position.
func (w *Watermark) Keepalive(walEnd pglogrepl.LSN) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.open {
		return
	}
	w.addBoundary(walEnd)
}

// addBoundary queues lsn behind the events recorded so far. Boundaries
// that share a sequence number collapse into one, which bounds the queue by the number of
// events in flight. Caller holds mu.
func (w *Watermark) addBoundary(lsn pglogrepl.LSN) {
	if n := len(w.boundaries); n > 0 && w.boundaries[n-1].seq == w.next {
		w.boundaries[n-1].lsn = max(w.boundaries[n-1].lsn, lsn)
	} else {
		w.boundaries = append(w.boundaries, boundary{seq: w.next, lsn: lsn})
	}
	w.release()
}

// MarkDone records that event seq is done: the broker acknowledged it and
// its row is marked, parked or gone (the janitor's Marks call it, invariant
// 10, docs/architecture.md). Events may be done in any order; at and id
// are its place in the stream and its id, which Done then reports for the
// newest event of the done prefix.
func (w *Watermark) MarkDone(seq uint64, at wal.Place, id string) {
	w.ack(seq, placed{at: at, id: id, set: true})
}

func (w *Watermark) ack(seq uint64, p placed) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if seq < w.acked {
		return
	}
	w.early[seq] = p
	for {
		e, ok := w.early[w.acked]
		if !ok {
			break
		}
		if e.set {
			w.done = e
		}
		delete(w.early, w.acked)
		w.acked++
	}
	w.release()
}

// Done returns the place and id of the newest event, done with MarkDone,
// such that it and every event recorded before it are acked; ok is false
// when there is none yet. Unlike Position it can stand inside a
// transaction: the next session skips what it names (publish.Carryover).
func (w *Watermark) Done() (at wal.Place, id string, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.done.at, w.done.id, w.done.set
}

// Acked is an acknowledged event's place and id.
type Acked struct {
	At wal.Place
	ID string
}

// DoneAhead lists the events done with MarkDone past the acked prefix: done
// although an event before them is not (it went out on another publishing
// channel and was refused, or its confirm never came). The next session
// skips them too (publish.Carryover.DoneAhead).
func (w *Watermark) DoneAhead() []Acked {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Acked
	for _, e := range w.early {
		if e.set {
			out = append(out, Acked{At: e.at, ID: e.id})
		}
	}
	return out
}

// release moves the position over every boundary whose events are all acked.
// Caller holds mu.
func (w *Watermark) release() {
	i := 0
	for ; i < len(w.boundaries) && w.boundaries[i].seq <= w.acked; i++ {
		w.position = max(w.position, w.boundaries[i].lsn)
	}
	if i > 0 {
		w.boundaries = append(w.boundaries[:0], w.boundaries[i:]...)
	}
}

// Position is the LSN that may be reported as written, flushed and applied.
func (w *Watermark) Position() pglogrepl.LSN {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.position
}

// Pending is the number of recorded events not yet acked.
func (w *Watermark) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return int(w.next - w.acked)
}
