package publish

import (
	"context"
	"sync"

	"golang.org/x/sync/semaphore"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// This file holds what makes the publisher send a message alone on a
// drained channel: a message that may make the broker close the channel,
// whose owed confirms the broker then never sends.

// exchangesSeen holds the row exchanges (CDCRELAY_EXCHANGE_COLUMN) that a
// confirm of this session has shown to exist: one session's belief, never
// kept longer (docs/architecture.md, "What the relay remembers"). Safe for
// concurrent use.
type exchangesSeen struct {
	mu sync.Mutex
	m  map[string]bool
}

func (e *exchangesSeen) add(name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil || len(e.m) >= maxSeen {
		e.m = make(map[string]bool)
	}
	e.m[name] = true
}

func (e *exchangesSeen) has(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.m[name]
}

// laneWindow is how many messages one lane may have unconfirmed.
func (p *Publisher) laneWindow() int { return max(p.MaxInFlight/len(p.sink.lanes()), 1) }

// drainFor reports whether ev is the first message to a row's exchange
// that no confirm of this session has shown to exist and, if so, returns
// once nothing else is in flight on its lane: ev then goes alone. A
// missing exchange makes the broker close the channel (404), and the
// confirms it owed for the messages before are never sent, so they would
// be published again although the broker took them (review h52; invariant
// 11, docs/architecture.md); alone, the 404 also names its row at once
// (blame). above says ev is above the broker's learned max_message_size:
// a 406 closes the channel the same way, so it drains too. ev already
// holds one of the lane's slots; the others are free once the confirm
// loop has handled every message before it.
func (p *Publisher) drainFor(ctx context.Context, ev *wal.Event, slots *semaphore.Weighted, above bool) (bool, error) {
	if !above && (ev.Exchange == "" || ev.Exchange == p.Exchange || p.seen.has(ev.Exchange)) {
		return false, nil
	}
	others := int64(p.laneWindow() - 1)
	if err := slots.Acquire(ctx, others); err != nil {
		return false, err
	}
	slots.Release(others)
	return true, nil
}
