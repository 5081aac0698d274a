package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// This file is the origin gate. While a session streams with origin
// 'none' (origin.go), the walsender skips undecoded every transaction that
// carries a replication origin, and decideOrigins looked at the cluster's
// origins once, when the session started. An origin created since (CREATE
// SUBSCRIPTION creates one) may carry outbox inserts that the stream never
// sees; confirming past them would lose them for good. So the gate lets
// the confirmed position pass an LSN only once a check that started after
// the reader received that LSN found every origin a relay's; when one is
// not, it ends the session before confirming past it, and the next
// session decodes every origin from the slot.
//
// Why that suffices: a transaction under origin X calls
// pg_replication_origin_session_setup(X) before its first change, and X
// exists then. If its commit lies at or before an LSN the reader had
// received when a check started, the commit was written before the check
// began, and X is in pg_replication_origin under the check's snapshot,
// or, created in that same transaction and not visible yet (its commit
// waits for a synchronous standby), in the shared-memory state, which
// holds every origin a session has set up (pgconnect.ForeignOrigins, where
// the role may read it). On a standby the same holds of the WAL it has
// replayed, the only WAL its walsender decodes. What no check sees is an
// origin created, used and dropped between two checks: the limit
// docs/configuration.md ("Marks the walsender does not decode") states.

// errForeignOrigin ends a session whose stream skips origins when a check
// finds an origin that is not a relay's. Retried: the next session's
// decideOrigins sees the origin and decodes everything.
var errForeignOrigin = errors.New("a replication origin that is not a relay's appeared while the stream skipped transactions with an origin")

// originGate stands between the reader and the watermark (wal.Positions)
// and runs the checks. Inactive (the session decodes every origin) it
// passes everything through and checks nothing.
type originGate struct {
	inner  wal.Positions
	active bool
	// check lists the origins that are not a relay's; done releases what
	// it holds. Called from run only.
	check func(ctx context.Context) ([]string, error)
	done  func()
	// interval paces the checks: at most one per status interval, and
	// none while the position does not move (the relay's promise of no
	// polling load). timeout bounds each.
	interval, timeout time.Duration
	// foreign is called when a check finds a foreign origin, before run
	// returns (the relay remembers it for the next sessions, origin.go).
	foreign func()
	log     *slog.Logger

	// received is the greatest boundary (a commit's end, a keepalive's WAL
	// end) the reader has handed on. Written by the reader's goroutine
	// only (Commit, Keepalive), read by run: atomic, no lock on the
	// reader's path.
	received atomic.Uint64
	// verified is what a check allowed: the position never passes it.
	// Written by run only; read by the reader (Position) and, once the
	// session's goroutines have returned, by windDown's Confirm.
	verified atomic.Uint64
	// nudge tells run that the watermark is past verified (Position);
	// one slot, so the reader never blocks on it (invariant 5,
	// docs/architecture.md).
	nudge chan struct{}

	// marks closes once the marks of a graceful stop have settled;
	// settled, which the reader waits for instead, closes once a last
	// check has run after that, so that the final status covers what the
	// stop acknowledged. Set before run starts.
	marks   <-chan struct{}
	settled chan struct{}
}

// newOriginGate returns the gate of a session that starts at start with
// status updates every interval; active only when the session asked for
// origin 'none' (r.skipOrigins).
func (r *Relay) newOriginGate(inner wal.Positions, start pglogrepl.LSN, interval time.Duration) *originGate {
	g := &originGate{inner: inner, active: r.skipOrigins, interval: interval, timeout: 3 * interval,
		nudge: make(chan struct{}, 1), log: r.log}
	g.received.Store(uint64(start))
	g.verified.Store(uint64(start))
	if g.active {
		c := &originCheck{r: r}
		g.check, g.done = c.foreignOrigins, c.close
		g.foreign = func() { r.originMemo.seen.Store(true) }
	}
	return g
}

// Begin, NextSeq, Commit and Keepalive are the watermark's, noting what
// the reader received.
func (g *originGate) Begin()          { g.inner.Begin() }
func (g *originGate) NextSeq() uint64 { return g.inner.NextSeq() }

func (g *originGate) Commit(end pglogrepl.LSN) {
	g.receivedUpTo(end)
	g.inner.Commit(end)
}

func (g *originGate) Keepalive(walEnd pglogrepl.LSN) {
	g.receivedUpTo(walEnd)
	g.inner.Keepalive(walEnd)
}

func (g *originGate) receivedUpTo(lsn pglogrepl.LSN) {
	if uint64(lsn) > g.received.Load() {
		g.received.Store(uint64(lsn))
	}
}

// Position is the watermark's position, but never past what a check
// allowed (invariant 1, docs/architecture.md: an event the stream never
// saw is not acknowledged either). Past it, it asks run for a check.
func (g *originGate) Position() pglogrepl.LSN {
	p := g.inner.Position()
	if !g.active {
		return p
	}
	v := pglogrepl.LSN(g.verified.Load())
	if p <= v {
		return p
	}
	select {
	case g.nudge <- struct{}{}:
	default:
	}
	return v
}

// Settled is what the reader waits for before its final status, in place
// of marks (wal.ReaderConfig.Settled). Call it before run.
func (g *originGate) Settled(marks <-chan struct{}) <-chan struct{} {
	if !g.active {
		return marks
	}
	g.marks, g.settled = marks, make(chan struct{})
	return g.settled
}

// run checks the origins when the watermark waits for one, at most once
// per interval, until ctx ends or the reader has returned. It returns an
// error, which ends the session, when a check finds a foreign origin or
// fails: the slot then stays at the position the last check allowed.
func (g *originGate) run(ctx context.Context, readerDone <-chan struct{}) error {
	if !g.active {
		return nil
	}
	defer g.done()
	var last time.Time       // when the last check started
	var due <-chan time.Time // set while a check is wanted
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-readerDone:
			return nil
		case <-g.marks:
			g.marks = nil
			g.final(ctx)
		case <-g.nudge:
			if due == nil {
				due = time.After(time.Until(last.Add(g.interval)))
			}
		case <-due:
			due, last = nil, time.Now()
			if err := g.verify(ctx); err != nil && ctx.Err() == nil {
				return err
			}
		}
	}
}

// verify runs one check and, when every origin is a relay's, lets the
// position pass what the reader had received before it started.
func (g *originGate) verify(ctx context.Context) error {
	target := g.received.Load() // first: only what came before the check counts
	cctx, cancel := context.WithTimeout(ctx, g.timeout)
	foreign, err := g.check(cctx)
	cancel()
	if err != nil {
		return fmt.Errorf("check the replication origins (the stream skips transactions with one): %w", err)
	}
	if len(foreign) > 0 {
		g.foreign()
		return fmt.Errorf("%w: %s; the slot stays at %s, and the next session decodes every origin from there",
			errForeignOrigin, strings.Join(foreign, ", "), pglogrepl.LSN(g.verified.Load()))
	}
	if target > g.verified.Load() {
		g.verified.Store(target)
	}
	return nil
}

// final is the check of a graceful stop, after the marks settled: the
// reader reads nothing more, so it covers all it received. Whatever it
// finds, the reader then sends its final status, at most at what the
// checks allowed.
func (g *originGate) final(ctx context.Context) {
	defer close(g.settled)
	if err := g.verify(ctx); err != nil {
		g.log.Warn("the last check of the replication origins before stopping did not pass; the slot stays at the position the previous one allowed, and the next start decodes again from there",
			"position", pglogrepl.LSN(g.verified.Load()), "error", err)
	}
}

// originCheck is the gate's connection to the server that decodes (the
// standby of CDCRELAY_REPLICATION_URL, else the primary): the session
// closed its own before streaming. Opened at the first check, kept until
// the session ends. Used by the gate's goroutine only.
type originCheck struct {
	r      *Relay
	db     *pgx.Conn
	status bool // the role may read the shared-memory state
}

func (c *originCheck) foreignOrigins(ctx context.Context) ([]string, error) {
	if c.db == nil {
		url := c.r.cfg.DatabaseURL
		if c.r.cfg.ReplicationURL != "" {
			url = c.r.cfg.ReplicationURL
		}
		db, err := pgconnect.Connect(ctx, url, "to check replication origins", pgconnect.Options{})
		if err != nil {
			c.r.metrics.connectFailures.WithLabelValues("postgres").Inc()
			return nil, err
		}
		if c.status, err = pgconnect.ReadsOriginStatus(ctx, db); err != nil {
			pgconnect.Close(ctx, db)
			return nil, err
		}
		c.db = db
	}
	return pgconnect.ForeignOrigins(ctx, c.db, c.status)
}

func (c *originCheck) close() {
	if c.db != nil {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = c.db.Close(cctx)
	}
}
