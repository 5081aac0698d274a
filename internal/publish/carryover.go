package publish

import (
	"sync"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// carefulFor is how long a session publishes one message at a time after a
// session that the broker ended with a refusal (a nack, a return, a
// channel it closed): long enough for a consumer to drain a bounded queue's
// burst, short enough that a one-off refusal costs little throughput.
const carefulFor = 10 * time.Second

// maxNoCopy bounds the dead-letter copies remembered as refused.
const maxNoCopy = 1024

// Carryover is what one session leaves the next, so that a broker that
// refuses some messages cannot make the relay republish the same events
// session after session (invariant 11, docs/architecture.md). The relay keeps
// one for its life; each session's publisher consults it. It holds no
// event, only places (wal.Place), so its size is bounded.
//
//   - Through: every streamed event at or before this place was acknowledged
//     by the broker and its row marked (or parked) in an earlier session.
//     A session skips such events instead of publishing them again; the
//     slot still replays them, because its confirmed position can only
//     stand at a transaction's end, and a transaction larger than the
//     broker accepts at once would otherwise never complete.
//
//   - Careful: the events up to the last one published by a session the
//     broker ended with a refusal, and every event for carefulFor after
//     such a session, go out one at a time: nothing is published behind a
//     message until it is confirmed. A refusal then names its message
//     exactly (a channel closed for one message's content makes that row
//     poison), and a bounded queue that refuses one message cannot take the
//     next one ahead of it.
//
//   - Ahead: events past Through that were acknowledged and marked out of
//     order (another publishing channel's events behind a stalled or
//     refused row): skipped too, so a stall on one lane does not make every
//     session publish the other lanes' events again.
//
// Every remembered place is a belief about one stream: the places of one
// slot on one timeline of one database system, since the server last
// started. Anchor names that stream each session and drops every place when
// it changed (a promotion reuses LSNs on a new timeline; a crash may undo
// asynchronous commits; another system is another stream); a new slot
// (adoption) drops them too (Forget). What is about the broker, not the
// stream (the careful window's deadline after a refusal, the learned size
// limit) is kept. docs/architecture.md, "What the relay remembers", lists
// each piece and what drops it. Safe for concurrent use; a nil *Carryover
// remembers nothing.
type Carryover struct {
	mu       sync.Mutex
	stream   string // the stream the places belong to (Anchor); "": not named yet
	through  wal.Place
	id       string // the event at through, checked before anything is skipped
	set      bool
	ahead    map[wal.Place]string // done events past through, by place, with their ids
	careful  wal.Place            // events at or before it go out one at a time
	carefulT time.Time            // and every event until then
	refused  bool                 // the last session ended with a broker refusal
	noCopy   map[wal.Place]struct{}
	progress uint64 // bumped each time through moves
	// limit is the broker's max_message_size as learned from a refusal, 0
	// while unknown. A belief, not a rule: a message above it is sent alone
	// (so a refusal names it) rather than parked unsent, and the limit is
	// dropped once the broker accepts a message above it (the operator
	// raised it, or another node has another limit).
	limit    int64
	stalled  *Stall   // the row the stream is stalled on, if any
	stalledM *Metrics // where the stall is exported, to withdraw it
}

// maxAhead bounds the places remembered past Through; beyond it the
// newest are not remembered, which costs only duplicates.
const maxAhead = 1 << 16

// Done records that the event at at (with id) and every streamed event
// before it are acknowledged and marked. through never moves back.
func (r *Carryover) Done(at wal.Place, id string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.set && !r.through.Before(at) {
		return
	}
	r.through, r.id, r.set = at, id, true
	r.progress++
	if r.stalled != nil && !r.through.Before(r.stalled.At) {
		r.dropStall()
	}
	for p := range r.ahead {
		if !r.through.Before(p) {
			delete(r.ahead, p)
		}
	}
}

// DoneAhead records that the event at at (with id) is acknowledged and
// marked although an earlier one is not (it went out on another
// publishing channel): the next session skips it too.
func (r *Carryover) DoneAhead(at wal.Place, id string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.set && !r.through.Before(at) {
		return
	}
	if r.ahead == nil {
		r.ahead = make(map[wal.Place]string)
	}
	if len(r.ahead) < maxAhead {
		r.ahead[at] = id
	}
}

// Anchor names the stream this session reads (for the relay: the database
// system, its timeline and when its servers started). When it is not the
// stream the remembered places were learned from, they are dropped, and
// Anchor reports true: a promoted standby's new timeline reuses the LSNs
// of events its old primary had and it never received, and a crash may
// have undone marks committed asynchronously; skipping by an old place
// would skip events that exist (invariant 11, docs/architecture.md).
func (r *Carryover) Anchor(stream string) (forgot bool) {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stream != "" && r.stream != stream {
		forgot = r.set || len(r.ahead) > 0 || r.careful != (wal.Place{}) || r.stalled != nil
		r.forgetPlaces()
	}
	r.stream = stream
	return forgot
}

// Progress counts the moves of Done: a session that moved it made progress
// however it ended.
func (r *Carryover) Progress() uint64 {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.progress
}

// Failed records how a session ended: last is the place of the newest
// streamed event it published (ok false: none), refused whether the broker
// ended it by refusing a message rather than by a transport failure.
func (r *Carryover) Failed(last wal.Place, ok, refused bool) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refused = refused
	if refused && ok && r.careful.Before(last) {
		r.careful = last
	}
}

// Begin starts a session: after a refusal it publishes one message at a
// time for carefulFor.
func (r *Carryover) Begin(now time.Time) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refused {
		r.carefulT = now.Add(carefulFor)
		r.refused = false
	}
}

// Forget drops every remembered place: the slot was created anew, and its
// places are another stream's. The careful window's deadline and the
// broker's limit are about the broker, not the stream: a refusal during an
// adoption still makes the next one publish the backlog one message at a
// time, so that the refusal names its row.
func (r *Carryover) Forget() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgetPlaces()
}

// forgetPlaces drops what names a place in the stream, the stall's row
// included (it is named again if the new stream stalls on it). Caller
// holds mu.
func (r *Carryover) forgetPlaces() {
	r.through, r.id, r.set = wal.Place{}, "", false
	r.ahead = nil
	r.careful = wal.Place{}
	r.noCopy = nil
	r.dropStall()
}

// verdict is what the publisher does with an event.
type verdict int

const (
	publishFast    verdict = iota // publish within the window
	publishAlone                  // publish, and wait for its confirm before the next
	skipDone                      // done in an earlier session: do not publish
	skipUnverified                // at the remembered place but another id: publish, and forget
)

// judge says what to do with ev. A backfilled event is never skipped (a
// new slot's snapshot holds only rows not yet marked), and goes alone only
// for carefulFor after a refusal: its place is the new slot's.
func (r *Carryover) judge(ev *wal.Event) verdict {
	if r == nil {
		return publishFast
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if ev.Backfill {
		if !r.carefulT.IsZero() && time.Now().Before(r.carefulT) {
			return publishAlone
		}
		return publishFast
	}
	at := ev.Place()
	if r.set && !r.through.Before(at) {
		if at == r.through && ev.ID != r.id {
			// Not the event the place was recorded for: the stream is not
			// the one remembered. Trust nothing remembered.
			r.set, r.ahead = false, nil
			return skipUnverified
		}
		return skipDone
	}
	if id, ok := r.ahead[at]; ok {
		if id != ev.ID {
			r.set, r.ahead = false, nil
			return skipUnverified
		}
		return skipDone
	}
	if !r.careful.Before(at) || (!r.carefulT.IsZero() && time.Now().Before(r.carefulT)) {
		return publishAlone
	}
	return publishFast
}

// refuseCopy remembers that the dead-letter copy of the event at at was
// refused, so a later session parks it without a copy.
func (r *Carryover) refuseCopy(at wal.Place) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.noCopy == nil || len(r.noCopy) >= maxNoCopy {
		r.noCopy = make(map[wal.Place]struct{})
	}
	r.noCopy[at] = struct{}{}
}

// copyRefused reports whether the dead-letter copy of the event at at was
// refused before.
func (r *Carryover) copyRefused(at wal.Place) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.noCopy[at]
	return ok
}

// Stall is the row the stream is stalled on (CDCRELAY_UNROUTABLE=stall).
type Stall struct {
	ID, Exchange, RoutingKey string
	Cause                    string // "no_route" or "no_exchange"
	At                       wal.Place
}

// The causes of a stall.
const (
	CauseNoRoute    = "no_route"
	CauseNoExchange = "no_exchange"
)

// stall records the row the stream is stalled on, and exports it.
func (r *Carryover) stall(s Stall, m *Metrics) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stalled != nil && *r.stalled == s {
		return
	}
	if r.stalled != nil {
		r.stalledM.stalled.DeleteLabelValues(r.stalled.ID, r.stalled.Exchange, r.stalled.RoutingKey, r.stalled.Cause)
	}
	r.stalled, r.stalledM = &s, m
	m.stalled.WithLabelValues(s.ID, s.Exchange, s.RoutingKey, s.Cause).Set(1)
}

// unstall forgets the stall once the stalled event itself is done
// (acknowledged, parked or skipped as done). An event past it proves
// nothing: with several publishing channels the other lanes' events behind
// the stalled row are acknowledged, or skipped as done ahead, at the start
// of every retry while the row still stalls. Done ends the stall too, once
// the contiguous watermark passes it.
func (r *Carryover) unstall(at wal.Place, m *Metrics) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stalled == nil || at != r.stalled.At {
		return
	}
	r.dropStall()
}

// dropStall withdraws the exported stall. Caller holds mu.
func (r *Carryover) dropStall() {
	if r.stalled == nil {
		return
	}
	r.stalledM.stalled.DeleteLabelValues(r.stalled.ID, r.stalled.Exchange, r.stalled.RoutingKey, r.stalled.Cause)
	r.stalled, r.stalledM = nil, nil
}

// Stalled returns the row the stream is stalled on, if any.
func (r *Carryover) Stalled() (Stall, bool) {
	if r == nil {
		return Stall{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stalled == nil {
		return Stall{}, false
	}
	return *r.stalled, true
}

// BrokerLimit is the broker's max_message_size as learned from a refusal,
// 0 while unknown (or since the broker accepted a message above it).
func (r *Carryover) BrokerLimit() int64 {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.limit
}

// learnLimit records the broker's max_message_size.
func (r *Carryover) learnLimit(limit int64, m *Metrics) {
	if r == nil || limit <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.limit = limit
	m.brokerLimit.Set(float64(limit))
}

// aboveLimit reports whether a message body of size bytes is above the
// broker's learned limit: it then goes out alone, so that a refusal names
// it, instead of being parked unsent by a belief that may be stale.
func (r *Carryover) aboveLimit(size int64) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.limit > 0 && size > r.limit
}

// accepted records that the broker accepted a message body of size bytes:
// a learned limit below it is stale (the operator raised it, or this
// node's is larger), and is dropped. It reports whether it was.
func (r *Carryover) accepted(size int64, m *Metrics) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.limit == 0 || size <= r.limit {
		return false
	}
	r.limit = 0
	m.brokerLimit.Set(0)
	return true
}
