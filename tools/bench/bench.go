package main

// This file holds the bench's world and the order of its phases; each phase
// lives in its own file: setup.go, drain.go, latency.go, bigpayload.go,
// pgload.go (with pgsplit.go for PostgreSQL's CPU by process), standby.go
// (the relay streaming from a standby, on clusters of its own), with
// machine.go for the report's header, report.go for the report and
// targets.go for the table of cost targets.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/svckit/pgcluster"
	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

const (
	benchDatabase = "bench"
	benchSlot     = "cdcrelay_bench"
	relayRole     = "cdcrelay_bench" // the least-privilege role of docs/least-privilege.md
	drainerRole   = "drainer_bench"
	// backlogChunk is the transaction size used to build backlogs.
	backlogChunk = 1000
	// settle lets the relay's janitor and the walsender go quiet before an
	// idle window starts.
	settle = 2 * time.Second
	// deliveryGrace bounds waiting for the stragglers of a latency phase.
	deliveryGrace  = 60 * time.Second
	cleanupTimeout = 15 * time.Second
)

// bench is one run's world: a throwaway cluster, the bench exchange and
// queues on the local broker, and the consumer that records arrivals.
type bench struct {
	opts       options
	pg         *pgcluster.Postgres
	postmaster int
	brokerPID  int // the local broker's process, 0 when not found
	superURL   string
	relayURL   string
	drainerURL string
	amqpURL    string
	exchange   string
	queue      string
	partQueues []string   // the partitioned drain's queues, one per lane (none when it is skipped)
	partLanes  [][]string // partLanes[i]: the routing keys of lane i, bound to partQueues[i]
	partKeys   []string   // partLanes interleaved: the partitioned backlog's keys, round-robin
	db         *pgx.Conn  // superuser: the bench's own statements
	slotDB     *pgx.Conn  // superuser on the server that holds the slot, when not db (slotConn)
	standby    *standbyServer
	// caughtUp, when set, ends a drain's CPU window later: once the
	// slot's walsender has decoded the marks too (the standby part).
	caughtUp func(context.Context) error
	// pacedWatch, when set, runs while a relay latency phase inserts
	// (the standby part samples replay lag with it).
	pacedWatch func(context.Context)
	ins        *inserter
	// markedBelow: every row enqueued before it is marked (waitMarked).
	markedBelow time.Time
	cons        *consumer
	relay       *relayProc   // the running relay, if any
	relays      []*relayProc // every relay started, for their logs
	background  float64      // machine busy cores measured by the last prepare
	body        []byte       // an outbox payload as published, for the reference publisher
	trace       string
	relayVars   map[string]string
	runID       uint32
	res         *results
	cleanups    []func(context.Context) error
}

// runBench sets up, runs every phase and tears down.
func runBench(ctx context.Context, opts options) (*results, error) {
	b := &bench{opts: opts, runID: rand.Uint32(), res: &results{}}
	defer b.teardown()
	if err := b.setup(ctx); err != nil {
		return nil, err
	}
	if err := b.phases(ctx); err != nil {
		return nil, err
	}
	b.res.machine.loadEnd = readLoadAvg()
	for _, rp := range b.relays {
		for _, line := range strings.Split(strings.TrimSpace(rp.log.String()), "\n") {
			if line != "" {
				b.res.relayLog = append(b.res.relayLog, line)
			}
		}
	}
	return b.res, nil
}

// phases runs every phase; a failure carries the running relay's log.
func (b *bench) phases(ctx context.Context) error {
	err := b.runPhases(ctx)
	if err != nil && b.relay != nil {
		if log := strings.TrimSpace(b.relay.log.String()); log != "" {
			err = fmt.Errorf("%w\nrelay log (last lines):\n%s", err, toolkit.Tail(log, 20))
		}
	}
	return err
}

func (b *bench) runPhases(ctx context.Context) error {
	if b.opts.standbyOnly {
		b.opts.standby = true
		return b.standbyPart(ctx)
	}
	var err error
	r := b.res
	say("broker ceiling, run 1: %s persistent messages, confirms, one channel, %d in flight", toolkit.Thousands(b.opts.backlog), b.opts.inflight)
	if r.ceilings[0], err = b.ceiling(ctx); err != nil {
		return fmt.Errorf("broker ceiling: %w", err)
	}
	say("  %s msg/s", toolkit.Thousands(int(r.ceilings[0].rate())))
	if err := b.createSlot(ctx); err != nil {
		return err
	}
	if err := b.drainBacklog(ctx); err != nil {
		return fmt.Errorf("backlog drain: %w", err)
	}
	if b.opts.channels > 1 {
		if err := b.partitionedDrain(ctx); err != nil {
			return fmt.Errorf("partitioned drain: %w", err)
		}
	}
	say("broker ceiling, run 2")
	if r.ceilings[1], err = b.ceiling(ctx); err != nil {
		return fmt.Errorf("broker ceiling: %w", err)
	}
	say("  %s msg/s", toolkit.Thousands(int(r.ceilings[1].rate())))
	say("relay idle for %s: counting its statements on the primary", b.opts.idleFor)
	if r.idleRelay, err = b.idle(ctx, relayRole); err != nil {
		return err
	}
	r.lat = make([]latencyResult, len(b.opts.phases))
	r.ref = make([]latencyResult, len(b.opts.phases))
	for i, ph := range b.opts.phases {
		say("latency at %s ev/s (%d per transaction) for %s: relay", toolkit.Thousands(ph.rate), ph.perTx, b.opts.latencyFor)
		if r.lat[i], err = b.relayLatency(ctx, ph); err != nil {
			return fmt.Errorf("latency at %d ev/s: %w", ph.rate, err)
		}
		say("  p50 %s p99 %s max %s (inserted at %.0f ev/s)", toolkit.Ms(r.lat[i].p50), toolkit.Ms(r.lat[i].p99), toolkit.Ms(r.lat[i].max), r.lat[i].achieved)
		say("latency at %s ev/s: broker alone (publish → consumer)", toolkit.Thousands(ph.rate))
		if r.ref[i], err = b.brokerLatency(ctx, ph); err != nil {
			return fmt.Errorf("broker latency at %d ev/s: %w", ph.rate, err)
		}
		say("  p50 %s p99 %s max %s", toolkit.Ms(r.ref[i].p50), toolkit.Ms(r.ref[i].p99), toolkit.Ms(r.ref[i].max))
	}
	if err := b.bigTransaction(ctx); err != nil {
		return fmt.Errorf("large transaction: %w", err)
	}
	if err := b.bigPayloads(ctx); err != nil {
		return fmt.Errorf("backlog of large payloads: %w", err)
	}
	if err := b.pollingDrainer(ctx); err != nil {
		return fmt.Errorf("polling drainer: %w", err)
	}
	// Last, on clusters of its own, so that it moves none of the figures
	// above; it fails the bench only when interrupted.
	return b.standbyPart(ctx)
}
