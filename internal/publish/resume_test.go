package publish

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

func at(lsn pglogrepl.LSN, i int) wal.Place { return wal.Place{CommitLSN: lsn, Index: i} }

func evAt(id string, p wal.Place) *wal.Event {
	return &wal.Event{ID: id, CommitLSN: p.CommitLSN, Index: p.Index}
}

// TestResumeJudge: what a session does with each event, given what the
// sessions before it left.
func TestResumeJudge(t *testing.T) {
	r := &Resume{}
	if v := r.judge(evAt("a", at(100, 0))); v != publishFast {
		t.Fatalf("nothing remembered: %v, want publishFast", v)
	}
	r.Done(at(100, 2), "c")
	r.Done(at(100, 1), "b") // never back
	for _, c := range []struct {
		name string
		ev   *wal.Event
		want verdict
	}{
		{"before the place, same transaction", evAt("a", at(100, 0)), skipDone},
		{"an earlier transaction", evAt("z", at(90, 5)), skipDone},
		{"the place itself", evAt("c", at(100, 2)), skipDone},
		{"after the place, same transaction", evAt("d", at(100, 3)), publishFast},
		{"a later transaction", evAt("e", at(200, 0)), publishFast},
		{"backfilled, before the place", &wal.Event{ID: "f", CommitLSN: 50, Backfill: true}, publishFast},
	} {
		if got := r.judge(c.ev); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if r.Progress() != 1 {
		t.Fatalf("progress %d, want 1 (one move forward)", r.Progress())
	}

	// A refusal: up to the last published event, and for carefulFor after
	// the next session begins, one message at a time.
	r.Failed(at(300, 4), true, true)
	if v := r.judge(evAt("g", at(300, 4))); v != publishAlone {
		t.Fatalf("at the last published place after a refusal: %v, want publishAlone", v)
	}
	if v := r.judge(evAt("h", at(300, 5))); v != publishFast {
		t.Fatalf("past it, before the next session began: %v, want publishFast", v)
	}
	r.Begin(time.Now())
	if v := r.judge(evAt("h", at(300, 5))); v != publishAlone {
		t.Fatalf("past it, within carefulFor of a session after a refusal: %v, want publishAlone", v)
	}
	r.Begin(time.Now()) // a second session without a refusal in between keeps the deadline
	r.mu.Lock()
	r.carefulT = time.Now().Add(-time.Second)
	r.mu.Unlock()
	if v := r.judge(evAt("h", at(300, 5))); v != publishFast {
		t.Fatalf("after carefulFor: %v, want publishFast", v)
	}

	// A transport failure sets nothing careful.
	r.Failed(at(400, 0), true, false)
	r.Begin(time.Now())
	if v := r.judge(evAt("i", at(350, 0))); v != publishFast {
		t.Fatalf("after a transport failure: %v, want publishFast", v)
	}

	// Another event at the remembered place: the stream is not the one
	// remembered; nothing is skipped any more.
	if v := r.judge(evAt("other", at(100, 2))); v != skipUnverified {
		t.Fatalf("another id at the place: %v, want skipUnverified", v)
	}
	if v := r.judge(evAt("a", at(100, 0))); v != publishAlone && v != publishFast {
		t.Fatalf("after a mismatch, an earlier event: %v, want it published", v)
	}

	r.Done(at(500, 0), "j")
	r.Forget()
	if v := r.judge(evAt("j", at(500, 0))); v != publishFast {
		t.Fatalf("after Forget: %v, want publishFast", v)
	}
	var none *Resume
	none.Done(at(1, 1), "x")
	none.Failed(at(1, 1), true, true)
	if v := none.judge(evAt("x", at(1, 1))); v != publishFast {
		t.Fatalf("nil Resume: %v, want publishFast", v)
	}
}

// TestResumeStallAndLimit: a stall is exported until an event at or past
// it is done, and survives Forget; so does the broker's limit.
func TestResumeStallAndLimit(t *testing.T) {
	r := &Resume{}
	m := NewMetrics(prometheus.NewRegistry(), "")
	r.stall(Stall{ID: "s", Exchange: "events", RoutingKey: "nowhere", Cause: CauseNoRoute, At: at(100, 3)}, m)
	r.learnLimit(1<<20, m)
	r.Forget()
	if s, ok := r.Stalled(); !ok || s.ID != "s" {
		t.Fatalf("Stalled after Forget = %+v, %v", s, ok)
	}
	if r.BrokerLimit() != 1<<20 {
		t.Fatalf("BrokerLimit after Forget = %d", r.BrokerLimit())
	}
	r.unstall(at(100, 2), m)
	if _, ok := r.Stalled(); !ok {
		t.Fatal("an event before the stalled one ended the stall")
	}
	r.unstall(at(100, 3), m)
	if _, ok := r.Stalled(); ok {
		t.Fatal("the stalled event done, the stall remains")
	}
}
