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
	r := &Carryover{}
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
	var none *Carryover
	none.Done(at(1, 1), "x")
	none.Failed(at(1, 1), true, true)
	if v := none.judge(evAt("x", at(1, 1))); v != publishFast {
		t.Fatalf("nil Carryover: %v, want publishFast", v)
	}
}

// TestResumeStallAndLimit: a stall is exported until the stalled event is
// done or the contiguous watermark passes it; an event of another lane past
// it, acknowledged or skipped as done ahead, does not end it. Forget (a new
// slot) withdraws it, since its place is the old stream's, and keeps the
// broker's limit.
func TestResumeStallAndLimit(t *testing.T) {
	r := &Carryover{}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "")
	r.stall(Stall{ID: "s", Exchange: "events", RoutingKey: "nowhere", Cause: CauseNoRoute, At: at(100, 3)}, m)
	r.learnLimit(1<<20, m)
	r.unstall(at(100, 2), m)
	if _, ok := r.Stalled(); !ok {
		t.Fatal("an event before the stalled one ended the stall")
	}
	r.unstall(at(100, 4), m)
	r.unstall(at(150, 0), m)
	if _, ok := r.Stalled(); !ok {
		t.Fatal("an event of another lane past the stalled one ended the stall")
	}
	r.unstall(at(100, 3), m)
	if _, ok := r.Stalled(); ok {
		t.Fatal("the stalled event done, the stall remains")
	}
	r.stall(Stall{ID: "s1", Exchange: "events", RoutingKey: "nowhere", Cause: CauseNoRoute, At: at(120, 1)}, m)
	r.Done(at(120, 0), "before")
	if _, ok := r.Stalled(); !ok {
		t.Fatal("the watermark short of the stalled event ended the stall")
	}
	r.Done(at(130, 0), "past")
	if _, ok := r.Stalled(); ok {
		t.Fatal("the watermark passed the stalled event, the stall remains")
	}
	r.stall(Stall{ID: "s2", Exchange: "events", RoutingKey: "nowhere", Cause: CauseNoRoute, At: at(200, 0)}, m)
	r.Forget()
	if s, ok := r.Stalled(); ok {
		t.Fatalf("Stalled after Forget = %+v: the old stream's place", s)
	}
	if n := stalledSeries(t, reg); n != 0 {
		t.Fatalf("cdcrelay_stalled_event_info has %d series after Forget, want 0", n)
	}
	if r.BrokerLimit() != 1<<20 {
		t.Fatalf("BrokerLimit after Forget = %d", r.BrokerLimit())
	}
}

func stalledSeries(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "cdcrelay_stalled_event_info" {
			return len(f.GetMetric())
		}
	}
	return 0
}

// TestResumeAnchor: the places are a belief about one stream. A session
// on the same stream keeps them; another timeline, system or server start
// drops them all (through, the places done ahead, the careful place, the
// stall), and keeps what is about the broker (the careful deadline, the
// limit).
func TestResumeAnchor(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry(), "")
	for _, c := range []struct {
		name      string
		next      string
		wantForgo bool
	}{
		{"same stream", "system 1, timeline 1, started t0", false},
		{"a promotion: a new timeline", "system 1, timeline 2, started t0", true},
		{"a restart", "system 1, timeline 1, started t1", true},
		{"another system", "system 2, timeline 1, started t0", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &Carryover{}
			if r.Anchor("system 1, timeline 1, started t0") {
				t.Fatal("the first Anchor forgot something: there was nothing")
			}
			r.Done(at(100, 2), "c")
			r.DoneAhead(at(300, 0), "x")
			r.Failed(at(200, 0), true, true)
			r.Begin(time.Now())
			r.stall(Stall{ID: "s", At: at(250, 0)}, m)
			r.learnLimit(1<<20, m)
			if got := r.Anchor(c.next); got != c.wantForgo {
				t.Fatalf("Anchor = %v, want %v", got, c.wantForgo)
			}
			skip := r.judge(evAt("a", at(100, 0))) == skipDone
			ahead := r.judge(evAt("x", at(300, 0))) == skipDone
			if c.wantForgo {
				if skip || ahead {
					t.Fatalf("after %s an event at a remembered place was skipped (through %v, ahead %v)", c.name, skip, ahead)
				}
				if _, ok := r.Stalled(); ok {
					t.Fatal("the stall of the old stream survived")
				}
			} else if !skip || !ahead {
				t.Fatalf("the same stream: remembered places not skipped (through %v, ahead %v)", skip, ahead)
			}
			// The careful deadline is the broker's: kept either way.
			if v := r.judge(evAt("n", at(900, 0))); v != publishAlone {
				t.Fatalf("within the careful window: %v, want publishAlone", v)
			}
			if r.BrokerLimit() != 1<<20 {
				t.Fatal("the broker's limit was dropped with the stream's places")
			}
		})
	}
}

// TestResumeDoneAhead: events done past Through (another lane's, behind a
// stalled row) are skipped, unless the stream holds another event there;
// Through passing them prunes them.
func TestResumeDoneAhead(t *testing.T) {
	r := &Carryover{}
	r.Done(at(100, 0), "a")
	r.DoneAhead(at(100, 2), "c")
	r.DoneAhead(at(90, 0), "old") // behind through: nothing to remember
	if v := r.judge(evAt("b", at(100, 1))); v != publishFast {
		t.Fatalf("the stalled event: %v, want publishFast", v)
	}
	if v := r.judge(evAt("c", at(100, 2))); v != skipDone {
		t.Fatalf("an event done ahead: %v, want skipDone", v)
	}
	if v := r.judge(evAt("other", at(100, 2))); v != skipUnverified {
		t.Fatalf("another id at a place done ahead: %v, want skipUnverified", v)
	}
	if v := r.judge(evAt("c", at(100, 2))); v == skipDone {
		t.Fatal("after a mismatch, a place done ahead is still trusted")
	}
	r = &Carryover{}
	r.DoneAhead(at(100, 2), "c")
	r.Done(at(100, 3), "d")
	r.mu.Lock()
	n := len(r.ahead)
	r.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d places ahead kept after Through passed them", n)
	}
}

// TestResumeLimitIsABelief: a message above the learned limit is sent
// alone, not parked; once the broker accepts one, the limit is dropped.
func TestResumeLimitIsABelief(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "")
	r := &Carryover{}
	if r.aboveLimit(10 << 20) {
		t.Fatal("no limit learned, yet a message is above it")
	}
	r.learnLimit(1<<20, m)
	if !r.aboveLimit(2<<20) || r.aboveLimit(1<<20) {
		t.Fatal("aboveLimit does not compare with the learned limit")
	}
	if r.accepted(1<<20, m) {
		t.Fatal("a message at the limit dropped it")
	}
	if !r.accepted(2<<20, m) || r.BrokerLimit() != 0 || r.aboveLimit(2<<20) {
		t.Fatalf("the broker accepted 2 MiB above a 1 MiB limit, and the limit is still %d", r.BrokerLimit())
	}
	var none *Carryover
	if none.aboveLimit(1) || none.accepted(1, m) {
		t.Fatal("a nil Carryover knows a limit")
	}
}
