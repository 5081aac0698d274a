package monitor

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestOverlaps(t *testing.T) {
	cases := []struct {
		a, b []string
		want bool
	}{
		{nil, nil, false},
		{[]string{"3/1"}, nil, false},
		{[]string{"3/1", "4/9"}, []string{"4/8", "4/9"}, true},
		{[]string{"3/1", "4/9"}, []string{"3/2", "5/1"}, false},
		{[]string{"1/1"}, []string{"1/1"}, true},
	}
	for _, tc := range cases {
		if got := overlaps(tc.a, tc.b); got != tc.want {
			t.Errorf("overlaps(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestFloorSteps(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	ptr := func(t time.Time) *time.Time { return &t }
	var f floor
	// A transaction open at the first reading: no floor yet.
	f.observe(openAt{at(0), []string{"3/7"}})
	f.scanned(nil)
	if f.at != nil {
		t.Fatalf("floor %v with 3/7 still open", f.at)
	}
	// Still open at the second: neither reading settles.
	f.observe(openAt{at(15), []string{"3/7", "4/2"}})
	f.scanned(nil)
	if f.at != nil || len(f.pending) != 2 {
		t.Fatalf("floor %v, pending %d: want none and 2", f.at, len(f.pending))
	}
	// 3/7 ended, 4/2 did not: the first reading settles, the second not.
	f.observe(openAt{at(30), []string{"4/2", "5/1"}})
	f.scanned(nil)
	if f.at == nil || !f.at.Equal(at(0)) || len(f.pending) != 2 {
		t.Fatalf("floor %v, pending %d: want %v and 2", f.at, len(f.pending), at(0))
	}
	// Everything ended: the newest reading (this one, open set empty) settles;
	// an unpublished row older than it holds the floor.
	f.observe(openAt{at(45), nil})
	f.scanned(ptr(at(20)))
	if !f.at.Equal(at(20)) || len(f.pending) != 0 {
		t.Fatalf("floor %v, pending %d: want %v and 0", f.at, len(f.pending), at(20))
	}
	f.reset()
	if f.at != nil || f.pending != nil {
		t.Fatalf("reset left %+v", f)
	}
}

func TestFloorPendingBounded(t *testing.T) {
	var f floor
	t0 := time.Now()
	for i := range maxPending + 50 {
		f.observe(openAt{t0.Add(time.Duration(i) * time.Second), []string{"9/1"}})
		f.scanned(nil)
	}
	last := t0.Add(time.Duration(maxPending+49) * time.Second)
	if len(f.pending) != maxPending || !f.pending[0].at.Equal(t0) || !f.pending[maxPending-1].at.Equal(last) {
		t.Fatalf("pending %d from %v to %v, want %d from the oldest to the newest", len(f.pending), f.pending[0].at, f.pending[len(f.pending)-1].at, maxPending)
	}
	f.observe(openAt{t0.Add(time.Hour), nil})
	f.scanned(nil)
	if f.at == nil || !f.at.Equal(t0.Add(time.Hour)) {
		t.Fatalf("floor %v after the long transaction ended, want %v", f.at, t0.Add(time.Hour))
	}
}

// TestFloorModel runs the floor against a model of a database: sessions
// start transactions (their rows take the start time as enqueued_at), commit
// at random later times, and a relay publishes committed rows, some late
// and some never. At every refresh the scan sees the committed rows at or
// above the floor; the model checks that it then sees every committed
// unpublished row, as a scan of the whole table would.
func TestFloorModel(t *testing.T) {
	for seed := range uint64(200) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { floorModel(t, seed) })
	}
}

type modelRow struct {
	enqueued, commit, published int // ticks; published -1: never
}

type modelTx struct {
	id            string
	start, commit int
}

func floorModel(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	const ticks = 3000
	// Transactions: most short, some long; each commits a row or not.
	var txs []modelTx
	var rows []modelRow
	for i := 0; i < 600; i++ {
		start := rng.IntN(ticks)
		length := rng.IntN(5)
		if rng.IntN(10) == 0 {
			length = rng.IntN(800)
		}
		tx := modelTx{id: fmt.Sprintf("%d/%d", rng.IntN(4), i), start: start, commit: start + length}
		txs = append(txs, tx)
		if rng.IntN(4) > 0 {
			pub := tx.commit + 1 + rng.IntN(30)
			if rng.IntN(40) == 0 {
				pub = -1 // stuck
			}
			rows = append(rows, modelRow{enqueued: tx.start, commit: tx.commit, published: pub})
		}
	}
	base := time.Unix(0, 0)
	tm := func(tick int) time.Time { return base.Add(time.Duration(tick) * time.Second) }
	var f floor
	for now := 0; now < ticks; now += 1 + rng.IntN(15) {
		// The reading: transactions open now (started, not yet committed).
		var open []string
		for _, tx := range txs {
			if tx.start <= now && now < tx.commit {
				open = append(open, tx.id)
			}
		}
		slices.Sort(open)
		f.observe(openAt{tm(now), open})
		// The scan, a moment after: committed rows not yet published.
		var oldest *time.Time
		for _, r := range rows {
			visible := r.commit <= now
			unpublished := r.published < 0 || r.published > now
			if !visible || !unpublished {
				continue
			}
			if f.at != nil && tm(r.enqueued).Before(*f.at) {
				t.Fatalf("tick %d: committed unpublished row enqueued at %d (commit %d) is below the floor %v: the bounded scan misses it",
					now, r.enqueued, r.commit, f.at.Sub(base))
			}
			if e := tm(r.enqueued); oldest == nil || e.Before(*oldest) {
				oldest = &e
			}
		}
		f.scanned(oldest)
	}
	if f.at == nil {
		t.Fatalf("the floor never moved")
	}
}
