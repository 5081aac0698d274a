// Package relay wires the WAL reader and the publisher into sessions and
// restarts them from the slot after any failure.
//
// One session is the whole pipeline, from the replication slot to the
// broker and back:
//
//	commit ─► WAL ─► wal.Reader (decode, byte budget) ─► publish.Publisher
//	                      ▲                                   │ broker acks
//	                      │ status update                     ▼
//	              progress.Watermark ◄── contiguous prefix ◄── janitor.Marks (rows marked published_at)
//
// A session takes the slot lock, checks the publication and the slot,
// publishes a new slot's snapshot backlog if it has to (adoption), then
// streams. Any failure, on either side, ends the session and throws away
// everything in memory; the next session starts from the slot's confirmed
// position after a capped backoff, so a failure costs duplicates, never a
// gap. Relay runs the sessions; Service runs the relay beside the janitor,
// whose marks gate the slot (invariant 10, docs/architecture.md), and beside retention and the
// monitor, which never hold it back, and stops those only once the relay
// has drained.
//
// docs/architecture.md draws the same flow and numbers the invariants the
// comments in this package cite.
package relay
