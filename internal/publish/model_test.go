package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sync/semaphore"

	"github.com/cdcrelay/cdcrelay/internal/progress"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// The pipeline model test drives the real Publisher and progress.Watermark
// with decoded transactions on one side and a fake confirm-mode broker
// (fakebroker_test.go) on the other, through random acks, multiple acks,
// nacks, returns, closed channels, dropped connections and restarts from
// the slot's confirmed position. See docs/reliability.md, "Model test".

// modelOpts shape one scenario; modelOptsFrom decodes them from bytes so
// that the fuzzer can explore them.
type modelOpts struct {
	channels    int
	maxInFlight int
	maxBytes    int64
	inBuffer    int
	txns        int
	maxRows     int
	poison      bool
	dlx         bool
	stickyNack  bool
	pNack       float64
	pUnroutable float64
	faults      int // weight of each fault action (channel close, drop, restart, stop)
	steps       int // driver steps before the broker turns well-behaved
}

func modelOptsFrom(b []byte) modelOpts {
	at := func(i int) int {
		if i < len(b) {
			return int(b[i])
		}
		return 0
	}
	return modelOpts{
		channels:    1 + at(0)%4,
		maxInFlight: 1 + at(1)%16,
		maxBytes:    48 + int64(at(2))*8,
		inBuffer:    1 + at(3)%8,
		txns:        1 + at(4)%40,
		maxRows:     at(5) % 6,
		poison:      at(6)&1 != 0,
		dlx:         at(6)&2 != 0,
		stickyNack:  at(6)&4 != 0,
		pNack:       float64(at(7)%8) / 64,
		pUnroutable: float64(at(8)%4) / 8,
		faults:      at(9) % 4,
		steps:       200 + at(10)%8*100,
	}
}

type modelStats struct {
	scenarios, sessions, steps, events              int
	published, acks, nacks, returns, multiple, lost int
	channelCloses, drops, restarts, stops           int
	reorderedNack, reorderedReturn                  int
}

func (s *modelStats) add(o modelStats) {
	s.scenarios += o.scenarios
	s.sessions += o.sessions
	s.steps += o.steps
	s.events += o.events
	s.published += o.published
	s.acks += o.acks
	s.nacks += o.nacks
	s.returns += o.returns
	s.multiple += o.multiple
	s.lost += o.lost
	s.channelCloses += o.channelCloses
	s.drops += o.drops
	s.restarts += o.restarts
	s.stops += o.stops
	s.reorderedNack += o.reorderedNack
	s.reorderedReturn += o.reorderedReturn
}

// modelEvent is one outbox row of the history.
type modelEvent struct {
	ev     wal.Event
	ord    int // place in commit order over the whole history
	lane   int
	poison bool
}

type modelTxn struct {
	end    pglogrepl.LSN // commit end LSN: the slot replays it while its confirmed position is below
	events []modelEvent
}

// model is one scenario: the history, the broker and what the janitor was told.
type model struct {
	t       testing.TB
	o       modelOpts
	rng     *rand.Rand
	txns    []modelTxn
	events  map[string]*modelEvent
	final   pglogrepl.LSN // WAL end after the last commit, sent by idle keepalives
	b       *fakeBroker
	metrics *Metrics
	log     *slog.Logger

	slot    pglogrepl.LSN // the slot's confirmed position
	marked  map[string]bool
	parked  map[string]bool
	resume  *Carryover // what sessions leave the next, as the relay keeps it
	resumed int        // events skipped as done by an earlier session
	trace   []string
}

func newModel(t testing.TB, seed uint64, o modelOpts) *model {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	m := &model{
		t: t, o: o, rng: rng, events: map[string]*modelEvent{},
		metrics: NewMetrics(prometheus.NewRegistry(), ""), log: slog.New(slog.DiscardHandler),
		marked: map[string]bool{}, parked: map[string]bool{}, resume: &Carryover{},
	}
	keys := make([]string, 1+rng.IntN(6))
	for i := range keys {
		keys[i] = fmt.Sprintf("order.%d", i)
	}
	m.b = newFakeBroker(seed+1, o.channels)
	m.b.window = max(o.maxInFlight/o.channels, 1)
	m.b.pNack, m.b.stickyNack, m.b.pUnroutable, m.b.keys = o.pNack, o.stickyNack, o.pUnroutable, keys
	if o.dlx {
		m.b.dlx = "outbox.dead"
	}
	m.slot = pglogrepl.LSN(0x1000 + rng.IntN(0x100))
	lsn, ord := m.slot, 0
	for i := range o.txns {
		lsn += pglogrepl.LSN(1 + rng.IntN(64))
		commit := lsn + pglogrepl.LSN(rng.IntN(64))
		txn := modelTxn{end: commit + pglogrepl.LSN(1+rng.IntN(32))}
		for j := range rng.IntN(o.maxRows + 1) {
			ev := wal.Event{
				ID:         fmt.Sprintf("t%d.%d", i, j),
				RoutingKey: keys[rng.IntN(len(keys))],
				Payload:    fmt.Appendf(nil, `{"n":%d,"pad":%q}`, ord, strings.Repeat("x", rng.IntN(160))),
				CommitLSN:  commit, Index: j, PayloadIsJSON: true,
			}
			poison := o.poison && rng.IntN(10) == 0
			if poison { // AMQP cannot carry it: parked, never published as is
				ev.RoutingKey = strings.Repeat("k", 256+rng.IntN(8))
			}
			txn.events = append(txn.events, modelEvent{ev: ev, ord: ord, lane: LaneOf(ev.RoutingKey, o.channels), poison: poison})
			ord++
		}
		lsn = txn.end
		m.txns = append(m.txns, txn)
	}
	for i := range m.txns {
		for j := range m.txns[i].events {
			e := &m.txns[i].events[j]
			m.events[e.ev.ID] = e
		}
	}
	m.final = lsn + pglogrepl.LSN(1+rng.IntN(16))
	return m
}

func (m *model) tracef(format string, args ...any) {
	if len(m.trace) == 200 {
		m.trace = m.trace[100:]
	}
	m.trace = append(m.trace, fmt.Sprintf(format, args...))
}

// fail ends the scenario with everything needed to replay it by hand.
func (m *model) fail(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("%s\nopts %+v\nlast steps:\n  %s", fmt.Sprintf(format, args...), m.o, strings.Join(m.trace, "\n  "))
}

// checkProblems fails on anything the broker or the acker found.
func (m *model) checkProblems() {
	m.t.Helper()
	m.b.mu.Lock()
	p := m.b.problems
	m.b.mu.Unlock()
	if len(p) > 0 {
		m.fail("%s", strings.Join(p, "\n"))
	}
}

// session is one run of the pipeline from the slot's confirmed position:
// a new Watermark, a new connection, a new Publisher, and the reader's
// side played by the driver.
type session struct {
	m       *model
	start   pglogrepl.LSN
	w       *progress.Watermark
	in      chan wal.Event
	drained <-chan struct{}
	conn    *fakeConn
	cancel  context.CancelFunc
	done    chan error

	// The reader's state, as wal.Reader keeps it.
	txns    []modelTxn // what the slot replays: commit end above start
	next    int        // next transaction to decode
	row     int        // next row of txns[next] while open
	open    bool
	pending *wal.Event // decoded, waiting for room in In
	// weighed: pending's weight is taken from budget, the session's byte
	// budget, which the reader takes before it hands an event on and the
	// publisher gives back.
	weighed bool
	budget  *semaphore.Weighted
	stopped bool
	dropped int // events dropped by Stop while pending
	sent    pglogrepl.LSN
	lastP   pglogrepl.LSN
	checked int // txns[:checked] have been verified as passed

	// Guarded by m.b.mu: seq → id, what the Acker was told.
	seqID   map[uint64]string
	acked   map[uint64]bool
	parked  map[string]bool
	resumed map[string]bool

	p *Publisher
}

func (m *model) newSession() *session {
	s := &session{
		m: m, start: m.slot, w: progress.NewWatermark(m.slot), in: make(chan wal.Event, m.o.inBuffer),
		budget: semaphore.NewWeighted(m.o.maxBytes),
		done:   make(chan error, 1), sent: m.slot, lastP: m.slot,
		seqID: map[uint64]string{}, acked: map[uint64]bool{}, parked: map[string]bool{}, resumed: map[string]bool{},
	}
	for i, txn := range m.txns {
		if txn.end > m.slot {
			s.txns = m.txns[i:]
			break
		}
	}
	conn, link := m.b.connect(m.o.maxInFlight)
	s.conn = conn
	p := newPublisher(link, s.in, modelAcker{s}, s.budget, PublisherConfig{
		Exchange:    m.b.exchange,
		MaxInFlight: m.o.maxInFlight, MaxInFlightBytes: m.o.maxBytes,
		ConfirmTimeout:  time.Hour, // never fires: the model has no clock
		MaxMessageBytes: 1 << 20, Poison: Park, DeadLetterExchange: m.b.dlx,
		Log: m.log, Metrics: m.metrics, Carryover: m.resume,
	})
	m.resume.Begin(time.Now())
	s.p = p
	s.drained = p.Drained()
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() { s.done <- p.Run(ctx) }()
	m.b.mu.Lock()
	m.b.stats.sessions++
	m.b.mu.Unlock()
	m.tracef("session %d from %s: %d txns to replay", m.b.session, s.start, len(s.txns))
	return s
}

// modelAcker is what the relay wires as the Acker (janitor.Marks): the
// watermark, without the janitor's marking. It also checks that the publisher
// only reports what the broker confirmed.
type modelAcker struct{ s *session }

func (a modelAcker) Ack(ev Ref) {
	a.settle("Ack", ev, func(e *modelEvent) string {
		switch {
		case e.poison:
			return "for a poison event"
		case !a.s.m.b.sessionAcked[ev.ID]:
			return "but the broker did not ack it in this session"
		}
		return ""
	}, func() { a.s.m.marked[ev.ID] = true }) // the janitor sets published_at
}

// Parked comes as soon as the dead-letter copy is sent (or at once, without
// one): the row is recorded whatever the broker does with the copy.
func (a modelAcker) Parked(ev Ref, reason string) {
	a.settle("Parked", ev, func(e *modelEvent) string {
		if !e.poison {
			return "for a valid event: " + reason
		}
		return ""
	}, func() {
		a.s.parked[ev.ID] = true
		a.s.m.parked[ev.ID] = true // the janitor records last_error
	})
}

// Resumed is an event skipped because an earlier session had it acked and
// marked (or parked): it must be so.
func (a modelAcker) Resumed(ev Ref) {
	m := a.s.m
	a.settle("Resumed", ev, func(*modelEvent) string {
		if !m.marked[ev.ID] && !m.parked[ev.ID] {
			return "but no earlier session marked or parked it"
		}
		return ""
	}, func() {
		a.s.resumed[ev.ID] = true
		m.resumed++
	})
}

// Ending: the model's acker never waits.
func (a modelAcker) Ending() {}

// settle checks what every report must hold (the right event at the right
// place, reported once) and what is wrong with this one (a reason, or ""),
// records it with record, then tells the watermark, as the relay's acks do.
func (a modelAcker) settle(what string, ev Ref, wrong func(*modelEvent) string, record func()) {
	s := a.s
	b := s.m.b
	b.mu.Lock()
	switch e := s.m.events[ev.ID]; {
	case s.seqID[ev.Seq] != ev.ID:
		b.problem("%s(%d, %s): seq %d is event %q", what, ev.Seq, ev.ID, ev.Seq, s.seqID[ev.Seq])
	case s.acked[ev.Seq]:
		b.problem("%s(%d, %s) twice", what, ev.Seq, ev.ID)
	case e == nil:
		b.problem("%s(%d, %s): no such event", what, ev.Seq, ev.ID)
	case e.ev.Place() != ev.At:
		b.problem("%s(%d, %s) at %s, the event is at %s", what, ev.Seq, ev.ID, ev.At, e.ev.Place())
	default:
		if why := wrong(e); why != "" {
			b.problem("%s(%d, %s) %s", what, ev.Seq, ev.ID, why)
		}
	}
	s.acked[ev.Seq] = true
	record()
	b.mu.Unlock()
	s.w.MarkDone(ev.Seq, ev.At, ev.ID)
}

// read plays one turn of wal.Reader.Run: offer the pending event to In
// without blocking (the reader keeps sending status updates meanwhile), or
// decode the next message: Begin, an outbox row (Event assigns its Seq at
// decode time, before it is offered), Commit with the end LSN, or a
// keepalive (Keepalive with ServerWALEnd; the Watermark drops it while a
// transaction is open). Like the reader, it decodes nothing while an event
// waits. The real Reader needs a PostgreSQL connection; its calls on the
// Watermark and on Out are all it does that matters here.
func (s *session) read() {
	if s.stopped {
		return
	}
	if s.pending != nil {
		if !s.weighed {
			if !s.budget.TryAcquire(s.pending.Weight(s.m.o.maxBytes)) {
				return
			}
			s.weighed = true
		}
		select {
		case s.in <- *s.pending:
			s.pending, s.weighed = nil, false
		default:
		}
		return
	}
	rng := s.m.rng
	prev := s.start
	if s.next > 0 {
		prev = max(prev, s.txns[s.next-1].end)
	}
	switch {
	case s.next == len(s.txns): // idle: keepalives carry the WAL end
		s.w.Keepalive(s.m.final)
	case rng.IntN(8) == 0: // a keepalive between transactions or inside one
		end := s.txns[s.next].end
		walEnd := prev + pglogrepl.LSN(rng.IntN(int(end-prev)))
		if s.open { // may even reach past the open transaction: must be dropped
			walEnd = prev + pglogrepl.LSN(rng.IntN(int(end-prev)+64))
		}
		s.w.Keepalive(walEnd)
		s.m.tracef("keepalive %s open=%v", walEnd, s.open)
	case !s.open:
		s.w.Begin()
		s.open, s.row = true, 0
	case s.row < len(s.txns[s.next].events):
		ev := s.txns[s.next].events[s.row].ev
		ev.Seq = s.w.NextSeq()
		s.m.b.mu.Lock()
		s.seqID[ev.Seq] = ev.ID
		s.m.b.mu.Unlock()
		s.row++
		s.pending = &ev
		s.m.tracef("decode %s seq %d", ev.ID, ev.Seq)
		s.read()
	default:
		s.w.Commit(s.txns[s.next].end)
		s.m.tracef("commit %s", s.txns[s.next].end)
		s.open = false
		s.next++
	}
}

// caughtUp: every replayed transaction decoded and handed over.
func (s *session) caughtUp() bool { return s.next == len(s.txns) && s.pending == nil }

// status is a standby status update: the reader reports Position, never
// less than before.
func (s *session) status() { s.sent = max(s.sent, s.w.Position()) }

// stop is Reader.Stop: the pending event is dropped (its Seq stays
// unacked) and Out is closed; the publisher drains, then closes Drained.
func (s *session) stop() {
	if s.stopped {
		return
	}
	s.stopped = true
	if s.pending != nil {
		s.pending = nil
		s.dropped++
	}
	close(s.in)
	s.m.tracef("stop")
}

// check is invariant 1: the confirmed position never passes an event the
// broker has not acked in this session (or, for a poison event, that has
// not been parked, after its dead-letter copy was acked).
func (s *session) check() {
	m := s.m
	p := s.w.Position()
	if p < s.lastP {
		m.fail("position went back from %s to %s", s.lastP, p)
	}
	s.lastP = p
	if p > m.final {
		m.fail("position %s is past the WAL end %s", p, m.final)
	}
	for s.checked < len(s.txns) && s.txns[s.checked].end <= p {
		m.b.mu.Lock()
		for _, e := range s.txns[s.checked].events {
			id := e.ev.ID
			ok := m.b.sessionAcked[id] || s.resumed[id]
			if e.poison {
				ok = s.parked[id] || s.resumed[id]
			}
			if !ok {
				m.b.mu.Unlock()
				m.fail("position %s passed transaction %s but event %s was not acked (poison=%v) in session %d",
					p, s.txns[s.checked].end, id, e.poison, m.b.session)
			}
		}
		m.b.mu.Unlock()
		s.checked++
	}
}

// finish ends the session as the relay does once either side returns:
// the reader returns (closing Out), the link is closed, and the slot keeps
// the last position the reader reported. It checks the error Run gave.
func (s *session) finish(err error, graceful bool) {
	m := s.m
	s.cancel()
	s.closeIn()
	m.b.closeConn(s.conn, nil, false)
	// After a drain the reader sends a final status update; after a
	// failure the last one may or may not have got out.
	if err == nil || m.rng.IntN(2) == 0 {
		s.status()
	}
	m.slot = max(m.slot, s.sent)
	if err != nil { // as the relay's stream does after a failed session
		if at, id, ok := s.w.Done(); ok {
			m.resume.Done(at, id)
		}
		last, ok := s.p.Last()
		m.resume.Failed(last, ok, Refusal(err))
	}
	m.b.mu.Lock()
	nacks, returns := m.b.nacks, m.b.returns
	m.b.mu.Unlock()
	m.tracef("session ended: %v; slot at %s", err, m.slot)
	switch {
	case err == nil:
		if !graceful {
			m.fail("Run returned nil without a stop")
		}
		select {
		case <-s.drained:
		default:
			m.fail("Run returned nil but Drained is open")
		}
		if got := s.w.Pending(); got != s.dropped {
			m.fail("drained with %d events unacked, want %d (dropped by stop)", got, s.dropped)
		}
	case errors.Is(err, ErrNacked) && nacks == 0:
		m.fail("Run reported a nack the broker never sent: %v", err)
	case errors.Is(err, ErrReturned) && returns == 0:
		m.fail("Run reported a return the broker never sent: %v", err)
	case errors.Is(err, ErrNacked), errors.Is(err, ErrReturned), errors.Is(err, ErrClosed),
		errors.Is(err, amqp.ErrClosed), errors.Is(err, context.Canceled):
	default:
		m.fail("unexpected error from Run: %v", err)
	}
}

// closeIn is what the reader does when its Run returns: close Out.
func (s *session) closeIn() {
	if !s.stopped {
		s.stopped = true
		close(s.in)
	}
}

// wait is Run's result within a generous bound: every session must end
// once it has failed or been cancelled.
func (s *session) wait(why string) error {
	select {
	case err := <-s.done:
		return err
	case <-time.After(20 * time.Second):
		s.m.fail("Run did not return within 20s after %s", why)
		return nil
	}
}

// run plays the scenario: a fault phase of random steps, then a
// well-behaved broker until the slot is at the WAL end, then the checks
// on the whole history.
func (m *model) run() modelStats {
	s := m.newSession()
	for range m.o.steps {
		if s == nil {
			s = m.newSession()
		}
		s = m.faultStep(s)
	}
	m.b.mu.Lock()
	m.b.wellBehaved = true
	m.b.mu.Unlock()
	m.tracef("broker well-behaved from here")
	if s == nil {
		s = m.newSession()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if time.Now().After(deadline) {
			m.fail("no progress in 30s with a well-behaved broker: slot %s, position %s, WAL end %s, reader caught up %v",
				m.slot, s.w.Position(), m.final, s.caughtUp())
		}
		if s.caughtUp() && !s.stopped && s.w.Position() == m.final {
			s.stop()
		}
		select {
		case err := <-s.done:
			s.finish(err, s.stopped)
			if err == nil && m.slot == m.final {
				m.finalChecks()
				m.b.mu.Lock()
				defer m.b.mu.Unlock()
				m.b.stats.scenarios = 1
				m.b.stats.events = len(m.events)
				return m.b.stats
			}
			s = m.newSession()
			continue
		default:
		}
		switch m.rng.IntN(10) {
		case 0, 1, 2, 3:
			s.read()
		case 4, 5, 6:
			if !m.b.confirmOne(m.rng.IntN(3) == 0) {
				time.Sleep(10 * time.Microsecond)
			}
		case 7:
			s.status()
		default:
			runtime.Gosched()
		}
		s.check()
		m.checkProblems()
	}
}

// faultStep is one random step of the fault phase. It returns the session
// to go on with, nil once it has ended.
func (m *model) faultStep(s *session) *session {
	m.b.mu.Lock()
	m.b.stats.steps++
	m.b.mu.Unlock()
	select {
	case err := <-s.done:
		s.finish(err, s.stopped)
		return nil
	default:
	}
	f := m.o.faults
	weights := []int{400, 150, 60, 100, 40, 10, 5 * f, 5 * f, 5 * f, 2 * f, 70}
	n := 0
	for _, w := range weights {
		n += w
	}
	r := m.rng.IntN(n)
	action := 0
	for ; r >= weights[action]; action++ {
		r -= weights[action]
	}
	switch action {
	case 0:
		s.read()
	case 1, 2:
		m.b.confirmOne(action == 2)
	case 3:
		// Let the publisher's goroutines run; now and then long enough
		// for them to publish all they can.
		if m.rng.IntN(16) != 0 {
			runtime.Gosched()
		} else {
			time.Sleep(time.Duration(m.rng.IntN(50)) * time.Microsecond)
		}
	case 4:
		s.status()
	case 5:
		m.b.block(m.rng.IntN(2) == 0)
	case 6:
		m.tracef("channel close")
		m.b.closeChannel()
	case 7:
		m.tracef("connection dropped")
		m.b.closeConn(s.conn, &amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED - model", Server: true}, true)
	case 8: // the relay process dies: the broker sees the connection drop
		m.tracef("restart")
		m.b.mu.Lock()
		m.b.stats.restarts++
		m.b.mu.Unlock()
		m.b.closeConn(s.conn, &amqp.Error{Code: amqp.ConnectionForced, Reason: "model restart"}, true)
		// The reader's Run ends with the context too, closing Out; with
		// nothing in flight the publisher may then finish cleanly.
		s.cancel()
		s.stop()
		s.finish(s.wait("cancel"), true)
		return nil
	case 9:
		m.b.mu.Lock()
		m.b.stats.stops++
		m.b.mu.Unlock()
		s.stop()
	case 10:
		m.b.confirmBurst(2 + m.rng.IntN(4))
	}
	s.check()
	m.checkProblems()
	return s
}

// finalChecks: every event was delivered (or parked) at least once, the
// janitor was told only the truth, and first deliveries kept commit order
// per lane, except where the broker refused an earlier event and accepted
// a later one of the same lane in the same session (see reorderExcused).
// Such reorders are counted: with one channel, a return (an unroutable key)
// followed by a delivered event of another key is one, though no queue
// sees both keys; a nack followed by an ack is one a consumer does see.
func (m *model) finalChecks() {
	b := m.b
	b.mu.Lock()
	defer b.mu.Unlock()
	delivered := map[string]bool{}
	for _, log := range b.log {
		for _, e := range log {
			delivered[e.id] = true
		}
	}
	for id, e := range m.events {
		switch {
		case e.poison && !m.parked[id]:
			m.fail("poison event %s never parked", id)
		case e.poison && b.dlx != "" && !b.dlxSent[id]:
			m.fail("poison event %s never dead-lettered", id)
		case e.poison && (delivered[id] || m.marked[id]):
			m.fail("poison event %s delivered or marked published", id)
		case !e.poison && !delivered[id]:
			m.fail("event %s never delivered", id)
		case !e.poison && !m.marked[id]:
			m.fail("event %s never marked published", id)
		}
	}
	for lane, log := range b.log {
		seen := map[string]bool{}
		var firsts []logEntry
		for _, e := range log {
			if !seen[e.id] {
				seen[e.id] = true
				firsts = append(firsts, e)
			}
		}
		for j, later := range firsts {
			for _, earlier := range firsts[j+1:] {
				if m.events[earlier.id].ord > m.events[later.id].ord {
					continue
				}
				// earlier (in commit order) was first delivered after later.
				refused, ok := m.reorderExcused(lane, earlier.id, later)
				switch {
				case !ok:
					m.fail("lane %d: event %s first delivered (session %d) before %s, which precedes it in commit order",
						lane, later.id, later.session, earlier.id)
				case refused.returned:
					b.stats.reorderedReturn++
				default:
					b.stats.reorderedNack++
				}
			}
		}
	}
}

// reorderExcused: the broker refused (nacked or returned) event id on this
// lane in the session where later got its first delivery, before later was
// published. A queue that rejects a message and accepts the next one (say
// x-overflow=reject-publish while a consumer drains it) reorders first
// deliveries whatever the relay does: it learns of the nack only after it
// has published what follows. Caller holds b.mu.
func (m *model) reorderExcused(lane int, id string, later logEntry) (logEntry, bool) {
	for _, r := range m.b.refused[[2]int{later.session, lane}] {
		if r.id == id && r.tag < later.tag {
			return r, true
		}
	}
	return logEntry{}, false
}

func runModel(t testing.TB, seed uint64, o modelOpts) modelStats {
	t.Helper()
	m := newModel(t, seed, o)
	return m.run()
}

// modelCases are fixed scenarios that run in every `go test`.
var modelCases = []struct {
	name string
	seed uint64
	opts []byte
}{
	// channels, window, bytes, in buffer, txns, rows, flags (poison|dlx|sticky), nack, unroutable, faults, steps
	{"one-channel", 1, []byte{0, 7, 40, 3, 39, 5, 1, 4, 1, 2, 7}},
	{"one-channel-sticky-nacks", 2, []byte{0, 15, 255, 7, 39, 4, 5, 6, 0, 1, 7}},
	{"four-channels", 3, []byte{3, 15, 60, 2, 39, 5, 3, 3, 2, 2, 7}},
	{"two-channels-tiny-budget", 4, []byte{1, 3, 0, 0, 30, 5, 1, 2, 1, 3, 5}},
	{"three-channels-dlx", 5, []byte{2, 11, 20, 5, 39, 3, 3, 5, 3, 1, 7}},
	{"window-one", 6, []byte{0, 0, 100, 0, 25, 5, 3, 2, 1, 3, 4}},
	{"faults-only", 7, []byte{1, 9, 30, 4, 39, 5, 1, 0, 0, 3, 7}},
	{"no-faults", 8, []byte{3, 15, 255, 7, 39, 5, 3, 0, 0, 0, 3}},
	// Found the spread stall (TestPublisherEndsAfterFailureWithIdleInput).
	{"four-channels-idle-after-failure", 1796070723561372900, []byte{3, 177, 17, 11, 207, 223, 73, 33, 66, 143, 161}},
}

func TestPipelineModel(t *testing.T) {
	var total modelStats
	began := time.Now()
	for _, c := range modelCases {
		t.Run(c.name, func(t *testing.T) {
			total.add(runModel(t, c.seed, modelOptsFrom(c.opts)))
		})
	}
	// Then random scenarios for a fixed time; each one logs its seed and
	// options when it fails.
	const budget = 3 * time.Second
	base := uint64(time.Now().UnixNano())
	for i := uint64(0); time.Since(began) < budget; i++ {
		seed := base + i
		opts := make([]byte, 11)
		rng := rand.New(rand.NewPCG(seed, 0))
		for j := range opts {
			opts[j] = byte(rng.UintN(256))
		}
		ok := t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
			total.add(runModel(t, seed, modelOptsFrom(opts)))
		})
		if !ok {
			t.Logf("to replay it, add {\"name\", %d, []byte{%s}} to modelCases (goroutine scheduling still varies)", seed, byteList(opts))
			break
		}
	}
	took := time.Since(began)
	if total.scenarios == 0 || total.acks == 0 {
		t.Fatalf("the model ran %d scenarios with %d acks", total.scenarios, total.acks)
	}
	t.Logf("%d scenarios in %s (%.0f/s): %d sessions, %d steps, %d events, %d published, %d acked (%d multiple), %d nacked, %d returned, %d lost in transit, %d channel closes, %d connection drops, %d restarts, %d stops; first deliveries reordered after a nack %d, after a return %d",
		total.scenarios, took.Round(time.Millisecond), float64(total.scenarios)/took.Seconds(), total.sessions, total.steps,
		total.events, total.published, total.acks, total.multiple, total.nacks, total.returns, total.lost,
		total.channelCloses, total.drops, total.restarts, total.stops, total.reorderedNack, total.reorderedReturn)
}

// FuzzPipeline explores the scenario space: make fuzz runs it for longer.
func FuzzPipeline(f *testing.F) {
	for _, c := range modelCases {
		f.Add(c.seed, c.opts)
	}
	f.Fuzz(func(t *testing.T, seed uint64, opts []byte) {
		o := modelOptsFrom(opts)
		o.steps = min(o.steps, 400) // keep each execution short
		runModel(t, seed, o)
	})
}

// byteList writes b as Go's byte literals, "1, 2, 3".
func byteList(b []byte) string {
	parts := make([]string, len(b))
	for i, x := range b {
		parts[i] = strconv.Itoa(int(x))
	}
	return strings.Join(parts, ", ")
}
