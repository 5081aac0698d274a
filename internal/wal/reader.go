package wal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"
)

// Positions records the stream's shape for the ack watermark
// (progress.Watermark), which turns it into the position the reader confirms.
type Positions interface {
	Begin()
	NextSeq() uint64
	Commit(end pglogrepl.LSN)
	Keepalive(walEnd pglogrepl.LSN)
	Position() pglogrepl.LSN
}

// ReaderConfig is what a Reader works with besides its connection. One
// value serves one session.
type ReaderConfig struct {
	Decoder   *Decoder
	Positions Positions
	Out       chan<- Event // closed by Run when it returns
	// Budget is the byte budget of BudgetBytes shared with the
	// publisher: the reader takes an event's Weight before sending it to
	// Out and the publisher gives it back once the event is confirmed or
	// parked, so decoded events waiting in Out count against the same bound
	// as those in flight (invariant 6, docs/architecture.md).
	Budget      Budget
	BudgetBytes int64

	// StatusInterval bounds the time between two status updates; use at
	// most min(10s, wal_sender_timeout/2).
	StatusInterval time.Duration
	// Timeout, if positive, ends the session when the server has sent
	// nothing for that long while the reader was listening. Status updates
	// ask for a reply once the server has been silent for StatusInterval,
	// so a live server is never silent that long, and a partitioned one is
	// noticed without waiting minutes for TCP to give up. Use a few
	// StatusIntervals.
	Timeout time.Duration

	// SoftStop asks for a graceful stop when closed: read no more, keep
	// reporting the position until Settled is closed or the Run context,
	// the hard stop, ends; then send a final status update. The relay
	// closes Settled once the publisher has every in-flight confirm (it is
	// drained) and the janitor has marked their rows
	// (janitor.Marks.Settled).
	SoftStop <-chan struct{}
	Settled  <-chan struct{}

	// Turned, if set, is called at every turn of the loop (at least every
	// progressDelay), so a health check can tell a wedged reader.
	Turned func()

	Log     *slog.Logger // nil: discard
	Metrics *Metrics     // nil: registered nowhere
}

// Reader owns the replication connection: it is the only goroutine that
// reads from or writes to it. It decodes the stream, hands events to the
// publisher through Out and reports the acknowledged position back to the
// server. It never blocks on the broker: when Out is full it stops reading
// but keeps sending status updates, so the walsender is not killed for a
// slow broker (invariant 5, docs/architecture.md).
type Reader struct {
	cfg  ReaderConfig
	conn stream

	// lastRecv is when the server was last heard from, or when the reader
	// last went back to listening after waiting for room in Out.
	lastRecv time.Time

	sent     pglogrepl.LSN // last position reported to the server
	lastSent time.Time
	closed   bool // Out has been closed

	// recv bounds each receive so the loop turns at least every
	// progressDelay; one context serves every receive until its deadline,
	// which keeps a timer and an allocation off the per-message path.
	recv       context.Context //nolint:containedctx // reused across receives on purpose, see above
	recvCancel context.CancelFunc
}

// NewReader returns a reader of the replication connection conn, on which
// START_REPLICATION has been sent.
func NewReader(conn *pgconn.PgConn, cfg ReaderConfig) *Reader {
	return newReader(&pgStream{conn: conn}, cfg)
}

func newReader(conn stream, cfg ReaderConfig) *Reader {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(prometheus.NewRegistry(), "")
	}
	return &Reader{cfg: cfg, conn: conn}
}

// stream is the replication connection as the reader uses it: the seam
// that lets its status-update logic be tested without a server.
type stream interface {
	ReceiveMessage(ctx context.Context) (pgproto3.BackendMessage, error)
	SendStatus(ctx context.Context, s pglogrepl.StandbyStatusUpdate) error
	// unwatch leaves the connection as its owner expects it once the
	// reader is done with it (no receive deadline on the socket).
	unwatch()
	// broken reports a connection its driver has closed after a failure:
	// nothing may be sent on it (pgconn's own closing goroutine writes).
	broken() bool
}

// pgStream is a stream over a real replication connection.
//
// A receive context's deadline and cancellation go on the socket once per
// context (a read deadline, and an AfterFunc that moves it to the past),
// not once per message: pgconn would register and remove a context
// watcher at every ReceiveMessage, which at one event per transaction
// (begin, insert, commit and a keepalive or two: four to five messages per
// event) was about 7% of the relay's CPU. The semantics are
// pgconn's own DeadlineContextWatcherHandler's: a read that reaches the
// deadline returns a timeout and leaves the connection usable.
type pgStream struct {
	conn *pgconn.PgConn

	watched context.Context //nolint:containedctx // the receive context whose deadline is on the socket
	stop    func() bool     // unregisters the AfterFunc of watched
	mu      sync.Mutex      // orders the AfterFunc of an old context before a newer deadline
	gen     uint64          // bumped for each watched context, under mu
}

func (s *pgStream) ReceiveMessage(ctx context.Context) (pgproto3.BackendMessage, error) {
	if ctx != s.watched {
		s.watch(ctx)
	}
	msg, err := s.conn.ReceiveMessage(context.Background())
	if err != nil && ctx.Err() == context.Canceled && pgconn.Timeout(err) {
		// As pgconn reports a read interrupted by cancellation.
		return nil, fmt.Errorf("receive: %w", context.Canceled)
	}
	return msg, err
}

// watch puts ctx's deadline on the socket and makes ctx's end interrupt a
// read in progress. The AfterFunc of an older context may still be running:
// the generation keeps it from clobbering the newer deadline.
func (s *pgStream) watch(ctx context.Context) {
	if s.stop != nil {
		s.stop()
	}
	s.mu.Lock()
	s.gen++
	gen := s.gen
	deadline, _ := ctx.Deadline() // zero: none
	_ = s.conn.Conn().SetReadDeadline(deadline)
	s.mu.Unlock()
	s.watched = ctx
	s.stop = context.AfterFunc(ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.gen == gen {
			_ = s.conn.Conn().SetReadDeadline(aLongTimeAgo)
		}
	})
}

// unwatch clears the deadline, leaving the connection as pgconn expects it.
func (s *pgStream) unwatch() {
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
	s.mu.Lock()
	s.gen++
	_ = s.conn.Conn().SetReadDeadline(time.Time{})
	s.mu.Unlock()
	s.watched = nil
}

func (s *pgStream) broken() bool { return s.conn.IsClosed() }

// aLongTimeAgo is a deadline in the past: a read with it returns at once.
var aLongTimeAgo = time.Unix(1, 0)

func (s *pgStream) SendStatus(ctx context.Context, u pglogrepl.StandbyStatusUpdate) error {
	return pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, u)
}

// Budget is a byte budget (golang.org/x/sync/semaphore.Weighted fits).
type Budget interface {
	TryAcquire(n int64) bool
	Acquire(ctx context.Context, n int64) error
}

// progressDelay is how soon an advanced position is reported, so the slot
// follows acks closely without one update per ack.
const progressDelay = 200 * time.Millisecond

// Run streams until ctx ends (the hard stop), SoftStop is closed or an error occurs.
func (r *Reader) Run(ctx context.Context) error {
	defer r.closeOut()
	defer func() {
		if r.recvCancel != nil {
			r.recvCancel()
		}
		r.conn.unwatch()
	}()
	// soft ends with SoftStop, so a receive in progress returns at once.
	soft, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-r.cfg.SoftStop:
			cancel()
		case <-soft.Done():
		}
	}()
	var pending *Event // decoded, waiting for room in Out
	r.lastRecv = time.Now()
	for {
		if pending != nil {
			if err := r.offer(ctx, pending); err != nil {
				return err
			}
			if r.stopped() {
				return r.drain(ctx)
			}
			pending = nil
			continue
		}
		if r.stopped() {
			return r.drain(ctx)
		}
		if err := r.maybeSendStatus(false); err != nil {
			return err
		}
		ev, err := r.receive(ctx, soft)
		if err != nil {
			if r.stopped() {
				return r.drain(ctx)
			}
			return err
		}
		pending = ev
	}
}

// offer takes the event's weight from the byte budget, then waits for room
// in Out, keeping status updates flowing all along: the reader never blocks
// on the broker.
func (r *Reader) offer(ctx context.Context, ev *Event) error {
	if ok, err := r.reserve(ctx, ev.Weight(r.cfg.BudgetBytes)); !ok || err != nil {
		return err // !ok: SoftStop was closed; the event is not sent
	}
	select { // the common case: room at once, no timer needed
	case r.cfg.Out <- *ev:
		return nil
	default:
	}
	tick := time.NewTicker(progressDelay)
	defer tick.Stop()
	for {
		select {
		case r.cfg.Out <- *ev:
			// Waiting here was not listening: silence counts from now.
			r.lastRecv = time.Now()
			return nil
		case <-tick.C:
			if err := r.maybeSendStatus(false); err != nil {
				return err
			}
		case <-r.cfg.SoftStop:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// reserve takes n bytes of the budget, waiting in turns of progressDelay
// with a status update after each. It reports false when SoftStop was closed
// first. A session that ends drops its budget with it, so bytes taken for
// an event that was never sent need not be given back.
func (r *Reader) reserve(ctx context.Context, n int64) (bool, error) {
	if r.cfg.Budget.TryAcquire(n) {
		return true, nil
	}
	for {
		wait, cancel := context.WithTimeout(ctx, progressDelay)
		err := r.cfg.Budget.Acquire(wait, n)
		cancel()
		if err == nil {
			r.lastRecv = time.Now() // waiting here was not listening either
			return true, nil
		}
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		if r.stopped() {
			return false, nil
		}
		if err := r.maybeSendStatus(false); err != nil {
			return false, err
		}
	}
}

func (r *Reader) stopped() bool {
	select {
	case <-r.cfg.SoftStop:
		return true
	default:
		return false
	}
}

func (r *Reader) closeOut() {
	if !r.closed {
		r.closed = true
		close(r.cfg.Out)
	}
}

// receive reads one message and returns the event it carries, if any.
// soft is ctx, also ended by SoftStop.
func (r *Reader) receive(ctx, soft context.Context) (*Event, error) {
	if r.recv == nil || r.recv.Err() != nil {
		if r.recvCancel != nil {
			r.recvCancel()
		}
		r.recv, r.recvCancel = context.WithTimeout(soft, progressDelay)
	}
	msg, err := r.conn.ReceiveMessage(r.recv)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if pgconn.Timeout(err) || errors.Is(err, context.Canceled) {
			// The socket's deadline may pass a moment before the context's
			// timer fires: a new context for the next receive, not a
			// retry that fails at once until the timer catches up.
			r.recvCancel()
			r.recv = nil
			if silent := time.Since(r.lastRecv); r.cfg.Timeout > 0 && silent > r.cfg.Timeout {
				return nil, fmt.Errorf("replication stream: nothing from the server for %s although a reply was requested; the connection is presumed dead", silent.Round(time.Second))
			}
			return nil, nil
		}
		return nil, fmt.Errorf("receive replication message: %w", err)
	}
	r.lastRecv = time.Now()
	switch m := msg.(type) {
	case *pgproto3.CopyData:
		return r.handleCopyData(m.Data)
	case *pgproto3.ErrorResponse:
		return nil, fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(m))
	case *pgproto3.CopyDone:
		return nil, errors.New("replication stream: server ended the copy")
	default:
		r.cfg.Log.Debug("ignoring replication protocol message", "type", fmt.Sprintf("%T", msg))
		return nil, nil
	}
}

func (r *Reader) handleCopyData(data []byte) (*Event, error) {
	if len(data) == 0 {
		return nil, errors.New("replication stream: empty CopyData")
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return nil, fmt.Errorf("parse keepalive: %w", err)
		}
		r.cfg.Metrics.keepalives.Inc()
		r.cfg.Positions.Keepalive(ka.ServerWALEnd)
		return nil, r.maybeSendStatus(ka.ReplyRequested)
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return nil, fmt.Errorf("parse XLogData: %w", err)
		}
		return r.decode(xld)
	default:
		return nil, fmt.Errorf("replication stream: unknown CopyData type %q", data[0])
	}
}

func (r *Reader) decode(xld pglogrepl.XLogData) (*Event, error) {
	step, err := r.cfg.Decoder.Decode(xld.WALData)
	if err != nil {
		// Nothing at or past this message is confirmed: the session ends here
		// and the next one starts from the slot's confirmed position.
		return nil, fmt.Errorf("decode message at %s: %w", xld.WALStart, err)
	}
	if step.Notice != "" {
		r.cfg.Log.Warn(step.Notice)
	}
	if step.Skipped {
		r.cfg.Metrics.foreignSkipped.Inc()
	}
	switch step.Kind {
	case stepBegin:
		r.cfg.Positions.Begin()
	case stepCommit:
		r.cfg.Positions.Commit(step.Commit.TransactionEndLSN)
		r.cfg.Metrics.commits.Inc()
	case stepEvent:
		ev := step.Event
		ev.Seq = r.cfg.Positions.NextSeq()
		r.cfg.Metrics.decoded.Inc()
		r.cfg.Metrics.lastEvent.SetToCurrentTime()
		return &ev, nil
	}
	return nil, nil
}
