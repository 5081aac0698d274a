package janitor

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func newTest(batch int) *Janitor {
	return New(Options{MarkBatch: batch}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
}

// TestMarkBatches: ids come out in batches of MarkBatch in the order they
// were acked, a failed batch goes back in front, and a full batch wakes
// the writer.
func TestMarkBatches(t *testing.T) {
	j := newTest(3)
	for _, id := range []string{"a", "b"} {
		j.Mark(id)
	}
	select {
	case <-j.wake:
		t.Fatal("woken before a batch was full")
	default:
	}
	j.Mark("c")
	select {
	case <-j.wake:
	default:
		t.Fatal("a full batch did not wake the writer")
	}
	j.Mark("d")
	first := j.take()
	if len(first) != 3 || first[0] != "a" || first[2] != "c" {
		t.Fatalf("first batch %v", first)
	}
	j.putBack(first) // the UPDATE failed
	if got := j.take(); len(got) != 3 || got[0] != "a" {
		t.Fatalf("after a failure the batch was not retried first: %v", got)
	}
	if got := j.take(); len(got) != 1 || got[0] != "d" {
		t.Fatalf("last batch %v", got)
	}
	if got := j.take(); len(got) != 0 {
		t.Fatalf("empty queue gave %v", got)
	}
}

func TestParkQueue(t *testing.T) {
	j := newTest(10)
	j.Park("x", "bad json")
	select {
	case <-j.wake:
	default:
		t.Fatal("a parked event did not wake the writer")
	}
	j.requeueParked([]parked{{"w", "earlier"}})
	if len(j.parked) != 2 || j.parked[0].id != "w" || j.parked[1].reason != "bad json" {
		t.Fatalf("parked queue %+v", j.parked)
	}
}

// TestRetryUnseen: an id whose row a flush could not see is queued again,
// forgotten once found, and dropped (unmarked) after maxUnseen() misses.
func TestRetryUnseen(t *testing.T) {
	j := newTest(10)
	j.retryUnseen([]string{"late", "gone"})
	if got := j.take(); len(got) != 2 {
		t.Fatalf("not requeued: %v", got)
	}
	j.retryUnseen([]string{"gone"}) // "late" was found
	if _, ok := j.unseen["late"]; ok {
		t.Fatal("a found id is still counted")
	}
	for range j.maxUnseen() - 1 { // misses 3 to maxUnseen()+1
		j.take()
		j.retryUnseen([]string{"gone"})
	}
	if got := j.take(); len(got) != 0 {
		t.Fatalf("an id missed %d times is still queued: %v", j.maxUnseen()+1, got)
	}
	if _, ok := j.unseen["gone"]; ok {
		t.Fatal("a dropped id is still counted")
	}
}

// TestMaxUnseen: a missing row is retried for about unseenFor whatever the
// mark interval, and at least 20 times.
func TestMaxUnseen(t *testing.T) {
	for _, c := range []struct {
		interval time.Duration
		want     int
	}{
		{0, 20},
		{time.Second, 20},
		{500 * time.Millisecond, 20},
		{100 * time.Millisecond, 100},
		{10 * time.Millisecond, 1000},
	} {
		j := New(Options{MarkBatch: 10, MarkInterval: c.interval}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		if got := j.maxUnseen(); got != c.want {
			t.Errorf("MarkInterval %s: maxUnseen %d, want %d", c.interval, got, c.want)
		}
	}
}
