package publish

import (
	"sync"

	"github.com/jackc/pglogrepl"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// maxRefusals bounds the memory of Refusals; an entry only matters until
// the next session parks its event, so forgetting old ones costs at most
// one more session restart each.
const maxRefusals = 1024

// Refusals remembers, across sessions, the events whose publish the client
// library refused while encoding them (EncodeError). Such an error ends the
// session (amqp091-go shuts the connection down after a frame error, so the
// channel state is unsafe); the next session meets the same event again and
// parks it instead of publishing it, so one row never becomes a restart
// loop. An event is known by its id and position, which a restart from the
// slot reproduces; the id keeps an entry from matching another event at a
// position a new timeline reuses (docs/architecture.md, "What the relay
// remembers"). Safe for concurrent use; a nil *Refusals remembers
// nothing.
type Refusals struct {
	mu sync.Mutex
	m  map[refusal]string
}

type refusal struct {
	id        string
	commitLSN pglogrepl.LSN
	index     int
}

// refusalOf keys ev by id and place. A backfilled event's place is the new
// slot's consistent point, which the next adoption changes: it is keyed by
// its id alone (index -1).
func refusalOf(ev *wal.Event) refusal {
	if ev.Backfill {
		return refusal{id: ev.ID, index: -1}
	}
	return refusal{id: ev.ID, commitLSN: ev.CommitLSN, index: ev.Index}
}

// add records why ev could not be encoded.
func (r *Refusals) add(ev *wal.Event, reason string) { r.addKey(refusalOf(ev), reason) }

// addAt records why the event id at place at (backfilled or not) was
// refused.
func (r *Refusals) addAt(id string, at wal.Place, backfill bool, reason string) {
	r.addKey(refusalOf(&wal.Event{ID: id, CommitLSN: at.CommitLSN, Index: at.Index, Backfill: backfill}), reason)
}

func (r *Refusals) addKey(k refusal, reason string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil || len(r.m) >= maxRefusals {
		r.m = make(map[refusal]string)
	}
	r.m[k] = reason
}

// reason is why ev was refused in an earlier session, or "".
func (r *Refusals) reason(ev *wal.Event) string {
	if r == nil {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[refusalOf(ev)]
}

// Len is how many refused events are remembered.
func (r *Refusals) Len() int {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}
