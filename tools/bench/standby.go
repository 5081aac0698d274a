package main

// The standby part: the relay streaming from a physical standby
// (CDCRELAY_REPLICATION_URL, PostgreSQL 16+), against the same relay with
// its slot on the primary and against the polling drainer, all on one
// pair of clusters of their own (standbybin.go picks their binaries):
// what the primary still pays, what the standby pays, and what replay
// adds to latency. standbyreport.go reports it.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/svckit/pgcluster"
	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

const (
	// standbyName is the standby's physical slot on the primary and its
	// application_name there.
	standbyName = "bench_standby"
	// caughtUpWait bounds waiting for the slot's walsender to decode
	// the marks at the end of a drain's window.
	caughtUpWait = 10 * time.Second
	// relayApp starts the application_name of the relay's connections and
	// the name of its replication origins.
	relayApp = pgconnect.ApplicationName
)

// standbyPhase is the paced phase of the standby part.
var standbyPhase = latencyPhase{rate: 1000, perTx: 1}

// standbyServer is the standby part's physical standby.
type standbyServer struct {
	pg         *pgcluster.Postgres
	postmaster int
	db         *pgx.Conn // superuser, the bench database
	relayURL   string    // the relay's role, the bench database: CDCRELAY_REPLICATION_URL
	// lags are the replay lags sampled during the current paced phase.
	lags []time.Duration
}

// standbyResult is what the standby part measured. Every window's usage
// holds the primary's split (pgSplit) and the standby's (sbSplit).
type standbyResult struct {
	notRun   string // why the part did not run or did not finish; "" when it ran
	postgres string // the pair's server_version
	drainer  rateResult
	// drainerLat is the drainer at the paced phase's rate, the reference
	// of the paced target (pacedReference).
	drainerLat   latencyResult
	primaryDrain rateResult // slot on the primary
	standbyDrain rateResult // slot on the standby
	primaryLat   latencyResult
	standbyLat   latencyResult
	// primaryReplay and standbyReplay are the standby's replay lag
	// sampled during each paced phase (sampleReplay).
	primaryReplay summary
	standbyReplay summary
	// originOn and originOff are a backlog committed while the relay
	// streams from the standby with CDCRELAY_MARK_ORIGIN's default and
	// with off, originOffLat the paced phase with off: when the relay has
	// that setting (hasOrigin). origins lists the relay's replication
	// origins on the primary after the standby's paced phase.
	hasOrigin    bool
	originOn     rateResult
	originOff    rateResult
	originOffLat latencyResult
	origins      []string
	// layout is the outbox's during the relay's phases (-standby-layout;
	// the drainer's always run on the default one), indexes and
	// reloptions what the primary showed before them (standbylayout.go).
	layout     standbyLayout
	indexes    []string
	reloptions string
	// upd is what pg_stat_user_tables counted of the outbox's updates on
	// the primary in each window, HOT ones apart.
	upd struct {
		drainer, drainerLat, primaryDrain, primaryLat, standbyDrain, standbyLat, originOn, originOff, originOffLat updateCounts
	}
}

// standbyPart runs the part unless -standby=false. Only an interrupt
// fails the bench: binaries it cannot find or a failure on the way are
// recorded in notRun, which the report shows.
func (b *bench) standbyPart(ctx context.Context) error {
	r := &b.res.standby
	r.layout = b.opts.standbyLayout
	if !b.opts.standby {
		r.notRun = "skipped (-standby=false)"
		return nil
	}
	build, why := standbyBinaries(ctx, b.opts)
	if why != "" {
		r.notRun = why
		say("standby part NOT RUN: %s", why)
		return ctx.Err()
	}
	sb := &bench{
		opts: b.opts, runID: b.runID ^ 0x5bd1e995, res: &results{}, brokerPID: b.brokerPID, amqpURL: b.amqpURL,
		exchange: b.exchange, queue: b.queue, cons: b.cons, body: b.body, trace: b.trace,
	}
	err := sb.setupStandby(ctx, build, b.relayVars)
	if err == nil {
		err = sb.runStandby(ctx, r)
	}
	sb.teardown()
	b.relays = append(b.relays, sb.relays...)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		r.notRun = "failed: " + err.Error()
		say("standby part FAILED (the other figures stand): %v", err)
	}
	return nil
}

// runStandby runs the standby part's phases; a failure carries the running
// relay's log.
func (b *bench) runStandby(ctx context.Context, r *standbyResult) error {
	err := b.standbyPhases(ctx, r)
	if err != nil && b.relay != nil {
		if log := strings.TrimSpace(b.relay.log.String()); log != "" {
			err = fmt.Errorf("%w\nrelay log (last lines):\n%s", err, toolkit.Tail(log, 20))
		}
	}
	return err
}

// standbyPhases: the drainer's references first (a drain, and the paced
// phase), while no slot holds back its rows, on the default layout; then
// the outbox goes on -standby-layout's (applyLayout); then the relay with
// its slot on the primary, then on the standby, each a drain and the
// paced phase; then, if the relay has it, CDCRELAY_MARK_ORIGIN's
// comparison (originPhases). Each window counts the outbox's updates
// (countUpdates).
func (b *bench) standbyPhases(ctx context.Context, r *standbyResult) error {
	r.postgres = b.res.machine.postgres
	say("standby part: polling drainer on the PostgreSQL %s primary (default layout), the reference", r.postgres)
	err := b.countUpdates(ctx, &r.upd.drainer, func() (int, error) {
		var err error
		r.drainer, err = b.drainerDrain(ctx, nil)
		return r.drainer.events, err
	})
	if err != nil {
		return fmt.Errorf("polling drainer: %w", err)
	}
	err = b.countUpdates(ctx, &r.upd.drainerLat, func() (int, error) {
		var err error
		r.drainerLat, err = b.drainerPaced(ctx, standbyPhase)
		return r.drainerLat.events, err
	})
	if err != nil {
		return fmt.Errorf("polling drainer at %s ev/s: %w", toolkit.Thousands(standbyPhase.rate), err)
	}
	// The drainer marked every row it published: this only sets the bound
	// below which the relay phases' waits need not count (waitMarked).
	if err := b.waitMarked(ctx); err != nil {
		return fmt.Errorf("polling drainer: %w", err)
	}
	if err := b.applyLayout(ctx, r); err != nil {
		return err
	}
	if err := b.slotRun(ctx, "the primary", b.relayVars, &r.primaryDrain, &r.primaryLat, &r.primaryReplay, &r.upd.primaryDrain, &r.upd.primaryLat); err != nil {
		return err
	}
	if err := b.stopRelay(ctx, b.relay); err != nil {
		return err
	}
	if _, err := b.db.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, benchSlot); err != nil {
		return fmt.Errorf("drop the primary's slot: %w", err)
	}
	b.slotDB = b.standby.db
	vars := maps.Clone(b.relayVars)
	vars["REPLICATION_URL"] = b.standby.relayURL
	if err := b.slotRun(ctx, "the standby", vars, &r.standbyDrain, &r.standbyLat, &r.standbyReplay, &r.upd.standbyDrain, &r.upd.standbyLat); err != nil {
		return err
	}
	if r.origins, err = b.relayOrigins(ctx); err != nil {
		return err
	}
	if r.hasOrigin = b.knowsMarkOrigin(); r.hasOrigin {
		return b.originPhases(ctx, r, vars)
	}
	return b.stopRelay(ctx, b.relay)
}

// slotRun has the relay create its slot on where, drain a backlog from a
// stopped start and stream the paced phase (sampling replay lag), counting
// the outbox's updates in each (drainUpd, latUpd); the relay keeps
// running.
func (b *bench) slotRun(ctx context.Context, where string, vars map[string]string, drain *rateResult, lat *latencyResult, replay *summary,
	drainUpd, latUpd *updateCounts) error {
	say("standby part, slot on %s: the relay creates it, then stops", where)
	rp, err := b.startRelay(ctx, vars)
	if err != nil {
		return fmt.Errorf("create the slot on %s: %w", where, err)
	}
	if err := b.stopRelay(ctx, rp); err != nil {
		return err
	}
	n := b.opts.backlog
	say("inserting a backlog of %s events (transactions of %d) with the relay stopped", toolkit.Thousands(n), backlogChunk)
	want, err := b.insertBacklog(ctx, n, nil)
	if err != nil {
		return err
	}
	err = b.countUpdates(ctx, drainUpd, func() (int, error) {
		_, _, err := b.timeDrain(ctx, "drain, slot on "+where, vars, want, drain)
		return len(want), err
	})
	if err != nil {
		return fmt.Errorf("drain, slot on %s: %w", where, err)
	}
	say("  %s ev/s (first delivery %s after start)", toolkit.Thousands(int(drain.rate())), toolkit.Ms(drain.firstAfter))
	return b.countUpdates(ctx, latUpd, func() (int, error) {
		err := b.pacedRun(ctx, "slot on "+where, lat, replay)
		return lat.events, err
	})
}

// pacedRun streams the part's paced phase with the running relay,
// sampling the standby's replay lag, and waits for its marks.
func (b *bench) pacedRun(ctx context.Context, what string, lat *latencyResult, replay *summary) error {
	say("latency at %s ev/s (%d per transaction) for %s, %s", toolkit.Thousands(standbyPhase.rate), standbyPhase.perTx, b.opts.latencyFor, what)
	b.standby.lags = nil
	var err error
	if *lat, err = b.relayLatency(ctx, standbyPhase); err != nil {
		return fmt.Errorf("latency, %s: %w", what, err)
	}
	*replay = summarize(b.standby.lags)
	say("  p50 %s p99 %s max %s (inserted at %.0f ev/s); the standby's replay lag p50 %s max %s", toolkit.Ms(lat.p50), toolkit.Ms(lat.p99),
		toolkit.Ms(lat.max), lat.achieved, toolkit.Ms(replay.p50), toolkit.Ms(replay.max))
	return b.waitMarked(ctx)
}

// originPhases compares the janitor's marks with a replication origin
// (CDCRELAY_MARK_ORIGIN's default, auto, the role having the grants) and
// without (off), the slot on the standby: a backlog committed while the
// running relay streams, with each setting, and the paced phase with off
// (the standby part's own is auto's). A drain from a stopped relay would
// not do: a starting walsender decodes again from the slot's restart
// point, WAL of earlier phases that differs from one start to the next.
func (b *bench) originPhases(ctx context.Context, r *standbyResult, vars map[string]string) error {
	if err := b.countUpdates(ctx, &r.upd.originOn, func() (int, error) {
		return b.opts.backlog, b.streamedDrain(ctx, "MARK_ORIGIN default", &r.originOn)
	}); err != nil {
		return err
	}
	if err := b.stopRelay(ctx, b.relay); err != nil {
		return err
	}
	off := maps.Clone(vars)
	off["MARK_ORIGIN"] = "off"
	say("restarting the relay with CDCRELAY_MARK_ORIGIN=off")
	rp, err := b.startRelay(ctx, off)
	if err != nil {
		return err
	}
	b.defer_("stop relay", func(ctx context.Context) error { return rp.stop(ctx) })
	b.relay = rp
	if err := b.countUpdates(ctx, &r.upd.originOff, func() (int, error) {
		return b.opts.backlog, b.streamedDrain(ctx, "MARK_ORIGIN=off", &r.originOff)
	}); err != nil {
		return err
	}
	var lags summary
	if err := b.countUpdates(ctx, &r.upd.originOffLat, func() (int, error) {
		err := b.pacedRun(ctx, "slot on the standby, MARK_ORIGIN=off", &r.originOffLat, &lags)
		return r.originOffLat.events, err
	}); err != nil {
		return err
	}
	return b.stopRelay(ctx, rp)
}

// streamedDrain commits a backlog of opts.backlog events while the relay
// streams and times it from the first commit until the consumer has every
// event; the CPU window lasts until the rows are marked and the walsender
// has read the marks (caughtUp).
func (b *bench) streamedDrain(ctx context.Context, what string, res *rateResult) error {
	n := b.opts.backlog
	b.cons.reset()
	if err := b.prepare(ctx); err != nil {
		return err
	}
	say("%s: a backlog of %s events committed while the relay streams", what, toolkit.Thousands(n))
	before, err := b.sample(b.relay.Pid())
	if err != nil {
		return err
	}
	want, err := b.insertBacklog(ctx, n, nil)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, deliveryTimeout(n))
	defer cancel()
	a, err := b.cons.waitIDs(wctx, want, b.relay.Exited())
	if err != nil {
		return errors.Join(err, b.relay.exitError())
	}
	if err := b.waitMarked(ctx); err != nil {
		return err
	}
	if err := b.caughtUp(ctx); err != nil {
		return err
	}
	after, err := b.sample(b.relay.Pid())
	if err != nil {
		return err
	}
	*res = rateResult{events: n, took: a.last.Sub(before.at), firstAfter: a.first.Sub(before.at), use: before.until(after), duplicates: a.duplicates}
	b.cons.reset()
	say("  %s ev/s", toolkit.Thousands(int(res.rate())))
	return nil
}
