package wal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgproto3"
	"golang.org/x/sync/semaphore"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// These tests drive the reader's status-update logic over a fake
// replication stream (the stream seam): no server. They cover the
// keepalive reply, the cadence, the never-backwards rule and the final
// update of a graceful stop (invariants 1, 2 and 5, docs/architecture.md).

// fakeStream is a replication connection: the test feeds it server
// messages and reads the status updates the reader sends.
type fakeStream struct {
	msgs    chan pgproto3.BackendMessage
	updates chan pglogrepl.StandbyStatusUpdate
}

func newFakeStream() *fakeStream {
	return &fakeStream{msgs: make(chan pgproto3.BackendMessage, 16), updates: make(chan pglogrepl.StandbyStatusUpdate, 1024)}
}

// ReceiveMessage returns the next fed message or, when the receive's
// deadline passes first, a quiet turn, as the reader sees pgconn's.
func (f *fakeStream) ReceiveMessage(ctx context.Context) (pgproto3.BackendMessage, error) {
	select {
	case m := <-f.msgs:
		return m, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("fake receive: %w", context.Canceled)
	}
}

func (f *fakeStream) unwatch() {}

func (f *fakeStream) broken() bool { return false }

func (f *fakeStream) SendStatus(_ context.Context, u pglogrepl.StandbyStatusUpdate) error {
	f.updates <- u
	return nil
}

// keepalive is a primary keepalive message with the server's WAL end.
func keepalive(walEnd pglogrepl.LSN, reply bool) *pgproto3.CopyData {
	b := []byte{pglogrepl.PrimaryKeepaliveMessageByteID}
	b = binary.BigEndian.AppendUint64(b, uint64(walEnd))
	b = binary.BigEndian.AppendUint64(b, 0)
	r := byte(0)
	if reply {
		r = 1
	}
	return &pgproto3.CopyData{Data: append(b, r)}
}

// fakePositions is a watermark whose position the test sets; with follow,
// a keepalive moves it to the server's WAL end (an idle stream).
type fakePositions struct {
	mu     sync.Mutex
	pos    pglogrepl.LSN
	follow bool
	seq    uint64
}

func (p *fakePositions) Begin()                  {}
func (p *fakePositions) Commit(pglogrepl.LSN)    {}
func (p *fakePositions) NextSeq() uint64         { p.mu.Lock(); defer p.mu.Unlock(); p.seq++; return p.seq }
func (p *fakePositions) set(pos pglogrepl.LSN)   { p.mu.Lock(); p.pos = pos; p.mu.Unlock() }
func (p *fakePositions) Position() pglogrepl.LSN { p.mu.Lock(); defer p.mu.Unlock(); return p.pos }
func (p *fakePositions) Keepalive(w pglogrepl.LSN) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.follow {
		p.pos = w
	}
}

// statusRig is a reader over a fake stream, running until the test ends.
type statusRig struct {
	t       *testing.T
	stream  *fakeStream
	pos     *fakePositions
	out     chan Event
	stop    chan struct{}
	drained chan struct{}
	cancel  context.CancelFunc
	done    chan error
	turns   chan struct{}
}

func startStatusRig(t *testing.T, cfg ReaderConfig) *statusRig {
	t.Helper()
	r := &statusRig{
		t: t, stream: newFakeStream(), pos: &fakePositions{}, out: make(chan Event, 8),
		stop: make(chan struct{}), drained: make(chan struct{}), done: make(chan error, 1),
		turns: make(chan struct{}, 1),
	}
	if cfg.Positions == nil {
		cfg.Positions = r.pos
	}
	cfg.Decoder = NewDecoder(Mapping{Outbox: config.Outbox{Schema: "public", Table: "event_outbox", IDColumn: "id", RoutingKeyColumn: "routing_key", PayloadColumn: "payload"}})
	cfg.Out, cfg.SoftStop, cfg.Settled = r.out, r.stop, r.drained
	// A budget nothing gives back, as no publisher runs: room for far more
	// than any test sends, so only the status updates are under test.
	cfg.Budget, cfg.BudgetBytes = semaphore.NewWeighted(1<<40), 1<<40
	cfg.Turned = func() {
		select {
		case r.turns <- struct{}{}:
		default:
		}
	}
	reader := newReader(r.stream, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- reader.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Error("the reader did not return after its context ended")
		}
	})
	return r
}

// next returns the next status update the reader sends.
func (r *statusRig) next() pglogrepl.StandbyStatusUpdate {
	r.t.Helper()
	select {
	case u := <-r.stream.updates:
		if u.WALWritePosition != u.WALFlushPosition || u.WALFlushPosition != u.WALApplyPosition {
			r.t.Fatalf("status update with write %s, flush %s, apply %s: all three must be set alike",
				u.WALWritePosition, u.WALFlushPosition, u.WALApplyPosition)
		}
		return u
	case err := <-r.done:
		r.done <- err // for the cleanup
		r.t.Fatalf("reader ended while a status update was awaited: %v", err)
	case <-time.After(10 * time.Second):
		r.t.Fatal("no status update in 10s")
	}
	return pglogrepl.StandbyStatusUpdate{}
}

// await returns the first status update that reports pos.
func (r *statusRig) await(pos pglogrepl.LSN) pglogrepl.StandbyStatusUpdate {
	r.t.Helper()
	for {
		if u := r.next(); u.WALFlushPosition == pos {
			return u
		}
	}
}

// TestReaderRepliesToKeepalive: a keepalive that asks for a reply gets
// one at once, even when the position has not moved and the interval has
// not passed.
func TestReaderRepliesToKeepalive(t *testing.T) {
	r := startStatusRig(t, ReaderConfig{StatusInterval: time.Hour})
	r.pos.set(50)
	r.await(50) // the first update goes out at once; from here the interval holds
	r.stream.msgs <- keepalive(900, true)
	if u := r.next(); u.WALFlushPosition != 50 {
		t.Fatalf("reply to a keepalive reports %s, want the watermark's 50, not the server's WAL end", u.WALFlushPosition)
	}
}

// TestReaderConfirmsIdleKeepalive: with nothing in flight the watermark
// follows a keepalive's WAL end, and the reader reports it without being
// asked (invariant 2, docs/architecture.md).
func TestReaderConfirmsIdleKeepalive(t *testing.T) {
	r := startStatusRig(t, ReaderConfig{StatusInterval: time.Hour})
	r.pos.follow = true
	r.next()
	r.stream.msgs <- keepalive(700, false)
	r.await(700)
}

// TestReaderReportsProgressWithoutWaitingForTheInterval: a position that
// moves is reported after progressDelay, not StatusInterval; one that
// stands still is not reported again before the interval.
func TestReaderReportsProgressWithoutWaitingForTheInterval(t *testing.T) {
	r := startStatusRig(t, ReaderConfig{StatusInterval: time.Hour})
	r.next()
	r.pos.set(300)
	r.await(300)
	// Three more turns of the loop with nothing new: no update.
	for range 3 {
		<-r.turns
		select {
		case <-r.turns:
		case <-time.After(10 * time.Second):
			t.Fatal("the reader's loop stopped turning")
		}
	}
	select {
	case u := <-r.stream.updates:
		t.Fatalf("update %s sent with the position unchanged and the interval not passed", u.WALFlushPosition)
	default:
	}
}

// TestReaderKeepsSendingOnInterval: an idle stream still gets a status
// update every StatusInterval, so the walsender never times the relay out.
func TestReaderKeepsSendingOnInterval(t *testing.T) {
	r := startStatusRig(t, ReaderConfig{StatusInterval: 20 * time.Millisecond})
	r.pos.set(10)
	for range 5 {
		if u := r.next(); u.WALFlushPosition > 10 {
			t.Fatalf("idle update reports %s, past the position 10", u.WALFlushPosition)
		}
	}
}

// TestReaderNeverGoesBackwards: a position lower than one already
// reported is never sent.
func TestReaderNeverGoesBackwards(t *testing.T) {
	r := startStatusRig(t, ReaderConfig{StatusInterval: 20 * time.Millisecond})
	r.pos.set(500)
	r.await(500)
	r.pos.set(400)
	r.stream.msgs <- keepalive(400, true)
	for range 5 {
		if u := r.next(); u.WALFlushPosition != 500 {
			t.Fatalf("update reports %s after 500 was sent", u.WALFlushPosition)
		}
	}
}

// TestReaderAsksASilentServerToReply: once the server has been silent for
// StatusInterval, updates ask for a reply; if none comes within Timeout,
// the session ends.
func TestReaderAsksASilentServerToReply(t *testing.T) {
	r := startStatusRig(t, ReaderConfig{StatusInterval: 20 * time.Millisecond, Timeout: time.Second})
	for u := r.next(); !u.ReplyRequested; u = r.next() {
	}
	select {
	case err := <-r.done:
		if err == nil || !strings.Contains(err.Error(), "nothing from the server") {
			t.Fatalf("silent server: %v", err)
		}
		r.done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("a server silent past Timeout did not end the session")
	}
}

// TestReaderDrainsThenSendsAFinalUpdate: after SoftStop the reader closes
// Out, keeps reporting, and once Settled is closed sends the position
// then reached and returns nil.
func TestReaderDrainsThenSendsAFinalUpdate(t *testing.T) {
	r := startStatusRig(t, ReaderConfig{StatusInterval: time.Hour})
	r.pos.set(100)
	r.await(100)
	close(r.stop)
	select {
	case _, ok := <-r.out:
		if ok {
			t.Fatal("an event came out after the soft stop")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Out not closed after the soft stop")
	}
	r.pos.set(250) // the publisher's last confirms land during the drain
	r.await(250)
	r.pos.set(260)
	close(r.drained)
	var last pglogrepl.LSN
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("graceful stop: %v", err)
		}
		r.done <- nil
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not return after Settled")
	}
	for len(r.stream.updates) > 0 {
		last = (<-r.stream.updates).WALFlushPosition
	}
	if last != 260 {
		t.Fatalf("final update reports %s, want 260", last)
	}
}

// TestReaderHardStopStillSendsAFinalUpdate: when the hard stop (the Run
// context) ends a drain before Settled, the position reached is still
// reported once.
func TestReaderHardStopStillSendsAFinalUpdate(t *testing.T) {
	r := startStatusRig(t, ReaderConfig{StatusInterval: time.Hour})
	r.pos.set(100)
	r.await(100)
	close(r.stop)
	for range r.out {
	}
	r.pos.set(180)
	r.cancel()
	select {
	case err := <-r.done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("hard stop: %v, want context.Canceled", err)
		}
		r.done <- err
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not return after the hard stop")
	}
	var last pglogrepl.LSN
	for len(r.stream.updates) > 0 {
		last = (<-r.stream.updates).WALFlushPosition
	}
	if last != 180 {
		t.Fatalf("final update reports %s, want 180", last)
	}
}
