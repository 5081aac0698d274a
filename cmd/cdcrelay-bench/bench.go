package main

import (
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
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
	pg         *testenv.Postgres
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
	ins        *inserter
	cons       *consumer
	relay      *relayProc   // the running relay, if any
	relays     []*relayProc // every relay started, for their logs
	background float64      // machine busy cores measured by the last prepare
	body       []byte       // an outbox payload as published, for the reference publisher
	trace      string
	relayVars  map[string]string
	runID      uint32
	res        *results
	cleanups   []func(context.Context) error
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
	if err := b.pollingDrainer(ctx); err != nil {
		return fmt.Errorf("polling drainer: %w", err)
	}
	return nil
}

func (b *bench) setup(ctx context.Context) error {
	r := b.res
	r.machine = readMachine(b.opts.relay)
	b.amqpURL = testenv.AMQPURL()
	if err := testenv.CheckAMQP(ctx, b.amqpURL); err != nil {
		return err
	}
	b.brokerPID = findBroker(b.amqpURL)
	say("starting a throwaway PostgreSQL cluster (fsync off, pg_stat_statements)")
	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{
		Settings: map[string]string{"shared_preload_libraries": "pg_stat_statements"},
		Log:      os.Stderr,
	})
	if err != nil {
		return err
	}
	b.pg = pg
	b.defer_("remove PostgreSQL cluster", func(context.Context) error { return pg.Close() })
	if b.postmaster, err = postmasterPID(pg.DataDir()); err != nil {
		return err
	}
	if err := pg.CreateDatabase(ctx, benchDatabase); err != nil {
		return err
	}
	b.superURL = pg.URL(benchDatabase)
	if err := runOnce(ctx, b.opts.relay, toolkit.Env(map[string]string{"DATABASE_URL": b.superURL, "LOG_LEVEL": "warn"}), "migrate"); err != nil {
		return err
	}
	if b.db, err = pgx.Connect(ctx, b.superURL); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	b.defer_("close database connection", b.db.Close)
	_, err = b.db.Exec(ctx, `
		CREATE EXTENSION pg_stat_statements;
		CREATE ROLE `+relayRole+` LOGIN REPLICATION;
		GRANT SELECT, DELETE ON event_outbox TO `+relayRole+`;
		GRANT UPDATE (published_at, attempts, last_error) ON event_outbox TO `+relayRole+`;
		CREATE ROLE `+drainerRole+` LOGIN;
		GRANT SELECT ON event_outbox TO `+drainerRole+`;
		GRANT UPDATE (published_at) ON event_outbox TO `+drainerRole)
	if err != nil {
		return fmt.Errorf("roles: %w", err)
	}
	if err := b.db.QueryRow(ctx, "SHOW server_version").Scan(&r.machine.postgres); err != nil {
		return err
	}
	b.relayURL, b.drainerURL = withUser(b.superURL, relayRole), withUser(b.superURL, drainerRole)
	if b.ins, err = newInserter(ctx, b.superURL); err != nil {
		return err
	}
	b.defer_("close inserter", func(context.Context) error { return b.ins.close() })
	if b.body, b.trace, err = samplePayload(ctx, b.db, 50_000); err != nil {
		return err
	}
	r.payloadBytes = len(b.body)

	b.exchange = testenv.UniqueName("cdcrelay_bench")
	b.queue = testenv.UniqueName("cdcrelay_bench_q")
	if b.opts.channels > 1 {
		if b.partLanes, err = laneKeys(b.opts.channels, keysPerLane); err != nil {
			return err
		}
		b.partKeys = interleave(b.partLanes)
		for i := range b.partLanes {
			b.partQueues = append(b.partQueues, fmt.Sprintf("%s_part%d", b.queue, i))
		}
	}
	if err := b.declare(ctx); err != nil {
		return err
	}
	if b.cons, err = startConsumer(ctx, b.amqpURL, append([]string{b.queue}, b.partQueues...)...); err != nil {
		return err
	}
	b.defer_("stop consumer", func(context.Context) error { return b.cons.close() })
	if v, ok := b.cons.conn.Properties["version"].(string); ok {
		r.machine.rabbitmq = v
	}
	b.relayVars = map[string]string{
		"DATABASE_URL": b.relayURL, "AMQP_URL": b.amqpURL, "EXCHANGE": b.exchange, "SLOT": benchSlot,
		"HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": "warn", "MAX_IN_FLIGHT": strconv.Itoa(b.opts.inflight),
	}
	r.passThrough = passedThrough(b.relayVars)
	say("PostgreSQL %s, RabbitMQ %s, exchange %s, queue %s, payload %d bytes", r.machine.postgres, r.machine.rabbitmq, b.exchange, b.queue, r.payloadBytes)
	return nil
}

// declare creates the bench exchange, its durable queue bound with
// mainBinding and, for the partitioned drain, one durable queue per lane
// bound to exactly that lane's keys; it registers their deletion. The
// main binding does not match the partitioned keys, so the main queue
// never holds the partitioned drain's messages.
func (b *bench) declare(ctx context.Context) error {
	if err := testenv.DeclareExchange(ctx, b.amqpURL, b.exchange); err != nil {
		return err
	}
	b.defer_("delete exchange "+b.exchange, func(ctx context.Context) error {
		return testenv.DeleteExchange(ctx, b.amqpURL, b.exchange)
	})
	conn, err := testenv.DialAMQP(ctx, b.amqpURL)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	bind := func(queue string, keys ...string) error {
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare queue: %w", err)
		}
		b.defer_("delete queue "+queue, func(ctx context.Context) error {
			return testenv.DeleteQueue(ctx, b.amqpURL, queue)
		})
		for _, key := range keys {
			if err := ch.QueueBind(queue, key, b.exchange, false, nil); err != nil {
				return fmt.Errorf("bind queue %s to %s: %w", queue, key, err)
			}
		}
		return nil
	}
	if err := bind(b.queue, mainBinding); err != nil {
		return err
	}
	for i, q := range b.partQueues {
		if err := bind(q, b.partLanes[i]...); err != nil {
			return err
		}
	}
	return nil
}

// defer_ registers a teardown step; they run in reverse order.
func (b *bench) defer_(what string, fn func(context.Context) error) {
	b.cleanups = append(b.cleanups, func(ctx context.Context) error {
		if err := fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	})
}

func (b *bench) teardown() {
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		if err := b.cleanups[i](ctx); err != nil {
			fmt.Fprintln(os.Stderr, "cdcrelay-bench: cleanup:", err)
		}
		cancel()
	}
}

// window samples the CPU counters at the start and end of a measured phase.
type window struct {
	b        *bench
	relayPID int // 0 when the relay does not run in this window
	at       time.Time
	machine  machineCPU
	pg, self time.Duration
	relay    time.Duration
	broker   time.Duration
	// background is how busy the machine was (cores) just before the
	// window, while the bench itself was idle.
	background float64
}

func (b *bench) sample(relayPID int) (window, error) {
	w := window{b: b, relayPID: relayPID, at: time.Now(), background: b.background}
	var err error
	if w.machine, err = readMachineCPU(); err != nil {
		return w, err
	}
	if w.pg, err = treeCPU(b.postmaster); err != nil {
		return w, err
	}
	if w.self, err = processCPU(os.Getpid()); err != nil {
		return w, err
	}
	if relayPID != 0 {
		if w.relay, err = processCPU(relayPID); err != nil {
			return w, err
		}
	}
	if b.brokerPID != 0 {
		if w.broker, err = processCPU(b.brokerPID); err != nil {
			b.brokerPID = 0 // restarted meanwhile: stop reporting it
			w.broker = 0
		}
	}
	return w, nil
}

// usage is what was spent between two samples.
type usage struct {
	wall      time.Duration
	busyCores float64       // the whole machine: every process, ours or not
	pg        time.Duration // the throwaway cluster
	relay     time.Duration // the relay process
	bench     time.Duration // this process: consumer, publisher, inserter, drainer
	broker    time.Duration // the local RabbitMQ node (0 when not found)
	// background is how busy the machine was just before the window.
	background float64
}

func (w window) until(end window) usage {
	return usage{
		wall:       end.at.Sub(w.at),
		busyCores:  busyCores(w.machine, end.machine, runtime.NumCPU()),
		pg:         end.pg - w.pg,
		relay:      end.relay - w.relay,
		bench:      end.self - w.self,
		broker:     max(end.broker-w.broker, 0),
		background: w.background,
	}
}

// ceiling publishes opts.backlog relay-shaped messages with confirms and
// times them until the consumer has all of them.
func (b *bench) ceiling(ctx context.Context) (rateResult, error) {
	return b.ceilingOver(ctx, [][]string{{routingKey}})
}

// ceilingOver publishes opts.backlog messages straight to the broker with
// one publisher per lane, each its own connection and confirm channel with
// its share of the in-flight window (as the relay splits it over its
// channels), lane i's messages round-robin over lanes[i]'s keys, and times
// them until the consumer has all.
func (b *bench) ceilingOver(ctx context.Context, lanes [][]string) (rateResult, error) {
	n := b.opts.backlog
	want := make(map[string]struct{}, n)
	ids := make([]string, n)
	run := b.runID + uint32(rand.IntN(1<<16))<<16
	for i := range ids {
		ids[i] = benchID(run, i)
		want[ids[i]] = struct{}{}
	}
	b.cons.reset()
	if err := b.prepare(ctx); err != nil {
		return rateResult{}, err
	}
	pubs := make([]*confirmPublisher, len(lanes))
	for i := range pubs {
		pub, err := newConfirmPublisher(ctx, b.amqpURL, max(b.opts.inflight/len(lanes), 1))
		if err != nil {
			for _, p := range pubs[:i] {
				_ = p.finish()
			}
			return rateResult{}, err
		}
		pubs[i] = pub
	}
	before, err := b.sample(0)
	if err != nil {
		return rateResult{}, err
	}
	var g errgroup.Group
	for l, pub := range pubs {
		g.Go(func() error {
			keys := lanes[l]
			for i, k := l, 0; i < n; i, k = i+len(lanes), k+1 {
				if err := pub.publish(ctx, b.exchange, keys[k%len(keys)], benchMessage(ids[i], b.body, b.trace, i%backlogChunk)); err != nil {
					_ = pub.finish()
					return err
				}
			}
			return pub.finish()
		})
	}
	if err := g.Wait(); err != nil {
		return rateResult{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, deliveryTimeout(n))
	defer cancel()
	a, err := b.cons.waitIDs(wctx, want, nil)
	if err != nil {
		return rateResult{}, err
	}
	after, err := b.sample(0)
	if err != nil {
		return rateResult{}, err
	}
	b.cons.reset()
	return rateResult{events: n, took: a.last.Sub(before.at), firstAfter: a.first.Sub(before.at), use: before.until(after), duplicates: a.duplicates}, nil
}

func deliveryTimeout(n int) time.Duration {
	return time.Minute + time.Duration(n)*time.Millisecond // at least 1,000 ev/s
}

// createSlot runs the relay once so it creates the publication's slot, then
// stops it: the backlog that follows is in the slot's stream.
func (b *bench) createSlot(ctx context.Context) error {
	say("relay creates slot %s, then stops", benchSlot)
	rp, err := b.startRelay(ctx, b.relayVars)
	if err != nil {
		return err
	}
	return b.stopRelay(ctx, rp)
}

// launch starts the relay with vars (its CDCRELAY_* settings, normally
// b.relayVars) and keeps it for its log; it does not wait.
func (b *bench) launch(vars map[string]string) (*relayProc, error) {
	rp, err := startRelay(b.opts.relay, toolkit.Env(vars))
	if err != nil {
		return nil, err
	}
	b.relays = append(b.relays, rp)
	return rp, nil
}

// startRelay starts the relay with vars and waits until it streams from
// the slot.
func (b *bench) startRelay(ctx context.Context, vars map[string]string) (*relayProc, error) {
	rp, err := b.launch(vars)
	if err != nil {
		return nil, err
	}
	if err := b.waitSlot(ctx, true, rp.Exited()); err != nil {
		_ = rp.stop(ctx)
		return nil, errors.Join(err, rp.exitError())
	}
	return rp, nil
}

// stopRelay stops the relay gracefully and waits until the slot is free.
func (b *bench) stopRelay(ctx context.Context, rp *relayProc) error {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := rp.stop(sctx); err != nil {
		return err
	}
	return b.waitSlot(ctx, false, nil)
}

// waitSlot waits until the bench slot is (or is no longer) active.
func (b *bench) waitSlot(ctx context.Context, active bool, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		// Streaming means the slot is active and its adoption marker is
		// gone: a relay stopped before that would redo the adoption at its
		// next start and publish the next backlog from the snapshot
		// instead of the stream.
		var is bool
		err := b.db.QueryRow(ctx, `SELECT coalesce(bool_or(active) FILTER (WHERE slot_name = $1), false)
			AND NOT coalesce(bool_or(slot_name = $2), false) FROM pg_replication_slots`, benchSlot, slot.MarkerName(benchSlot)).Scan(&is)
		if err != nil {
			return fmt.Errorf("wait for slot %s active=%t: %w", benchSlot, active, err)
		}
		if is == active {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("slot %s not active=%t after 30s", benchSlot, active)
		case <-exited:
			return errStopped
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// insertBacklog commits n events in transactions of backlogChunk rows and
// returns their ids. Their routing keys go round-robin over keys; with no
// keys, all have routingKey.
func (b *bench) insertBacklog(ctx context.Context, n int, keys []string) (map[string]struct{}, error) {
	want := make(map[string]struct{}, n)
	for done := 0; done < n; {
		ids, _, err := b.ins.insertKeys(ctx, min(backlogChunk, n-done), keys)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			want[id] = struct{}{}
		}
		done += len(ids)
	}
	return want, nil
}

// quiesce takes the periodic background work that would otherwise land in
// a measured window at random out of it: a checkpoint, and the vacuum and
// analyze the inserts would trigger.
func (b *bench) quiesce(ctx context.Context) error {
	if _, err := b.db.Exec(ctx, "VACUUM ANALYZE event_outbox"); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	if _, err := b.db.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// quietBusy is the machine load (busy cores, every process) below which
// a phase starts at once; above it, prepare waits up to opts.quietWait for
// other work on a shared machine to pass.
const quietBusy = 0.3

// prepare readies a measured phase: the background work of our own cluster
// out of the way (quiesce), then the machine as quiet as it gets within
// opts.quietWait. The load it found is reported with the phase.
func (b *bench) prepare(ctx context.Context) error {
	if err := b.quiesce(ctx); err != nil {
		return err
	}
	deadline := time.Now().Add(b.opts.quietWait)
	for {
		m0, err := readMachineCPU()
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
		m1, err := readMachineCPU()
		if err != nil {
			return err
		}
		b.background = busyCores(m0, m1, runtime.NumCPU())
		if b.background < quietBusy || time.Now().After(deadline) {
			return nil
		}
	}
}

// unpublished counts rows not yet marked published_at.
func (b *bench) waitMarked(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var n int
		if err := b.db.QueryRow(ctx, `SELECT count(*) FROM event_outbox WHERE published_at IS NULL`).Scan(&n); err != nil {
			return fmt.Errorf("wait for the janitor to mark every row published: %w", err)
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d rows still unmarked after a minute: %w%s", n, ctx.Err(), b.describeUnmarked())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// describeUnmarked lists a few rows the janitor has not marked, for the
// error that reports them.
func (b *bench) describeUnmarked() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := b.db.Query(ctx, `SELECT id::text, enqueued_at, attempts, coalesce(last_error, '')
		FROM event_outbox WHERE published_at IS NULL ORDER BY enqueued_at LIMIT 5`)
	if err != nil {
		return ""
	}
	var out strings.Builder
	for rows.Next() {
		var id, lastError string
		var enqueued time.Time
		var attempts int
		if rows.Scan(&id, &enqueued, &attempts, &lastError) == nil {
			fmt.Fprintf(&out, "\n  unmarked: id %s enqueued %s attempts %d last_error %q", id, enqueued.Format(time.RFC3339Nano), attempts, lastError)
		}
	}
	return out.String()
}

// drainBacklog: with the relay stopped and its slot in place, commit a
// backlog, start the relay and time it until the consumer has every event.
// The relay keeps running afterwards, for the idle and latency phases.
func (b *bench) drainBacklog(ctx context.Context) error {
	n := b.opts.backlog
	say("inserting a backlog of %s events (transactions of %d) with the relay stopped", toolkit.Thousands(n), backlogChunk)
	want, err := b.insertBacklog(ctx, n, nil)
	if err != nil {
		return err
	}
	r := b.res
	rp, marked, err := b.timeDrain(ctx, "drain", b.relayVars, want, &r.drain)
	if err != nil {
		return err
	}
	r.markedAfter = marked
	if r.rssBacklog, err = peakRSS(rp.Pid()); err != nil {
		return err
	}
	say("  %s ev/s (first delivery %s after start), peak RSS %s", toolkit.Thousands(int(r.drain.rate())), toolkit.Ms(r.drain.firstAfter), mib(r.rssBacklog))
	return nil
}

// timeDrain times a drain (what) of the backlog want, already committed
// while the relay was stopped: it waits for a quiet machine, starts the
// relay with vars, and times it from its start until the consumer has every
// event. The CPU window runs until the janitor has marked every row, so
// the next phase starts with nothing left to mark; the janitor's lag
// after the last delivery is returned. The relay is left running (and
// registered for teardown).
func (b *bench) timeDrain(ctx context.Context, what string, vars map[string]string, want map[string]struct{}, res *rateResult) (*relayProc, time.Duration, error) {
	if err := b.prepare(ctx); err != nil {
		return nil, 0, err
	}
	say("starting the relay: %s", what)
	before, err := b.sample(0)
	if err != nil {
		return nil, 0, err
	}
	rp, err := b.launch(vars)
	if err != nil {
		return nil, 0, err
	}
	b.defer_("stop relay", func(ctx context.Context) error { return rp.stop(ctx) })
	b.relay = rp
	before.relayPID = rp.Pid()
	wctx, cancel := context.WithTimeout(ctx, deliveryTimeout(len(want)))
	defer cancel()
	a, err := b.cons.waitIDs(wctx, want, rp.Exited())
	if err != nil {
		return nil, 0, errors.Join(err, rp.exitError())
	}
	if err := b.waitMarked(ctx); err != nil {
		return nil, 0, err
	}
	marked := time.Now()
	after, err := b.sample(rp.Pid())
	if err != nil {
		return nil, 0, err
	}
	*res = rateResult{events: len(want), took: a.last.Sub(rp.Started()), firstAfter: a.first.Sub(rp.Started()), use: before.until(after), duplicates: a.duplicates}
	b.cons.reset()
	return rp, marked.Sub(a.last), nil
}

// partitionedDrain measures CDCRELAY_PUBLISH_CHANNELS: the relay drains a
// backlog of opts.backlog events spread round-robin over b.partKeys (each
// lane's keys bound to its own queue) once with one channel and once with
// opts.channels, each from a stopped relay, as drainBacklog does. It
// stops the relay drainBacklog left running and leaves a relay with the
// bench's usual settings running for the phases that follow.
func (b *bench) partitionedDrain(ctx context.Context) error {
	n, r := b.opts.backlog, b.res
	say("stopping the relay for the partitioned drain: %d routing keys bench.part.*, %d per channel, queue i bound to lane i's keys",
		len(b.partKeys), keysPerLane)
	if err := b.stopRelay(ctx, b.relay); err != nil {
		return err
	}
	for i, channels := range []int{1, b.opts.channels} {
		say("inserting a backlog of %s events over %d keys (transactions of %d) with the relay stopped", toolkit.Thousands(n), len(b.partKeys), backlogChunk)
		want, err := b.insertBacklog(ctx, n, b.partKeys)
		if err != nil {
			return err
		}
		vars := maps.Clone(b.relayVars)
		vars["PUBLISH_CHANNELS"] = strconv.Itoa(channels)
		what := fmt.Sprintf("drain with CDCRELAY_PUBLISH_CHANNELS=%d to %d queues", channels, len(b.partQueues))
		rp, _, err := b.timeDrain(ctx, what, vars, want, &r.part[i])
		if err != nil {
			return err
		}
		say("  %s ev/s (first delivery %s after start)", toolkit.Thousands(int(r.part[i].rate())), toolkit.Ms(r.part[i].firstAfter))
		if err := b.stopRelay(ctx, rp); err != nil {
			return err
		}
	}
	say("broker ceiling with %d publishers, one per queue", b.opts.channels)
	var err error
	if r.partCeiling, err = b.ceilingOver(ctx, b.partLanes); err != nil {
		return fmt.Errorf("broker ceiling, %d publishers: %w", b.opts.channels, err)
	}
	say("  %s msg/s", toolkit.Thousands(int(r.partCeiling.rate())))
	say("restarting the relay with the usual settings")
	rp, err := b.startRelay(ctx, b.relayVars)
	if err != nil {
		return err
	}
	b.defer_("stop relay", func(ctx context.Context) error { return rp.stop(ctx) })
	b.relay = rp
	return nil
}

// idle counts the statements role ran on the primary over opts.idleFor.
func (b *bench) idle(ctx context.Context, role string) (idleResult, error) {
	time.Sleep(settle)
	calls := func() (int64, error) {
		var n int64
		err := b.db.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE userid = to_regrole($1)`, role).Scan(&n)
		return n, err
	}
	c0, err := calls()
	if err != nil {
		return idleResult{}, fmt.Errorf("pg_stat_statements: %w", err)
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return idleResult{}, ctx.Err()
	case <-time.After(b.opts.idleFor):
	}
	c1, err := calls()
	if err != nil {
		return idleResult{}, fmt.Errorf("pg_stat_statements: %w", err)
	}
	return idleResult{calls: c1 - c0, window: time.Since(start)}, nil
}

// latencyPhase is a paced load: rate events/s in transactions of perTx.
type latencyPhase struct {
	rate, perTx int
	p99Target   time.Duration // 0: no target
}

// defaultPhases are the issue's: 1,000 events/s one per transaction, and
// 5,000 events/s ten per transaction.
const defaultPhases = "1000x1,5000x10"

// p99Targets are the targets for the default phases.
var p99Targets = map[[2]int]time.Duration{
	{1000, 1}:  10 * time.Millisecond,
	{5000, 10}: 50 * time.Millisecond,
}

// parsePhases reads "RATExPER_TX,..." (e.g. "1000x1,5000x10").
func parsePhases(s string) ([]latencyPhase, error) {
	var out []latencyPhase
	for _, part := range strings.Split(s, ",") {
		r, t, ok := strings.Cut(strings.TrimSpace(part), "x")
		rate, err1 := strconv.Atoi(r)
		perTx, err2 := strconv.Atoi(t)
		if !ok || err1 != nil || err2 != nil || rate < 1 || perTx < 1 || perTx > rate {
			return nil, fmt.Errorf("phase %q: want RATExPER_TX, e.g. 5000x10", part)
		}
		out = append(out, latencyPhase{rate: rate, perTx: perTx, p99Target: p99Targets[[2]int{rate, perTx}]})
	}
	return out, nil
}

func (ph latencyPhase) pacer() pacer {
	return pacer{interval: time.Second * time.Duration(ph.perTx) / time.Duration(ph.rate), maxLag: 100 * time.Millisecond}
}

// insertPaced commits the phase's transactions at its rate for
// opts.latencyFor and records when each event's COMMIT returned.
func (b *bench) insertPaced(ctx context.Context, ph latencyPhase, committed map[string]time.Time) (ticks int, took time.Duration, err error) {
	return ph.pacer().run(ctx, b.opts.latencyFor, func(int) error {
		ids, at, err := b.ins.insert(ctx, ph.perTx)
		for _, id := range ids {
			committed[id] = at
		}
		return err
	})
}

// relayLatency inserts at the phase's rate while the relay streams and
// measures, per event, consumer arrival minus the time COMMIT returned.
func (b *bench) relayLatency(ctx context.Context, ph latencyPhase) (latencyResult, error) {
	b.cons.reset()
	committed := make(map[string]time.Time, b.opts.latencyFor.Milliseconds()*int64(ph.rate)/1000)
	if err := b.prepare(ctx); err != nil {
		return latencyResult{}, err
	}
	before, err := b.sample(b.relay.Pid())
	if err != nil {
		return latencyResult{}, err
	}
	if b.opts.verbose {
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		go b.watchSendLag(sctx)
	}
	ticks, took, err := b.insertPaced(ctx, ph, committed)
	if err != nil {
		return latencyResult{}, err
	}
	after, err := b.sample(b.relay.Pid())
	if err != nil {
		return latencyResult{}, err
	}
	return b.collect(ctx, ph, committed, ticks, took, before.until(after), b.relay.Exited())
}

// brokerLatency is the reference: the same rate and batch shape published
// straight to the broker (confirms, same window), measured from just before
// the publish call to consumer arrival.
func (b *bench) brokerLatency(ctx context.Context, ph latencyPhase) (latencyResult, error) {
	b.cons.reset()
	if err := b.prepare(ctx); err != nil {
		return latencyResult{}, err
	}
	pub, err := newConfirmPublisher(ctx, b.amqpURL, b.opts.inflight)
	if err != nil {
		return latencyResult{}, err
	}
	sent := make(map[string]time.Time, b.opts.latencyFor.Milliseconds()*int64(ph.rate)/1000)
	run := b.runID ^ uint32(ph.rate)
	n := 0
	before, err := b.sample(b.relay.Pid())
	if err != nil {
		return latencyResult{}, err
	}
	ticks, took, err := ph.pacer().run(ctx, b.opts.latencyFor, func(int) error {
		for k := range ph.perTx {
			id := benchID(run, n)
			n++
			sent[id] = time.Now()
			if err := pub.publish(ctx, b.exchange, routingKey, benchMessage(id, b.body, b.trace, k)); err != nil {
				return err
			}
		}
		return nil
	})
	if err := errors.Join(err, pub.finish()); err != nil {
		return latencyResult{}, err
	}
	after, err := b.sample(b.relay.Pid())
	if err != nil {
		return latencyResult{}, err
	}
	return b.collect(ctx, ph, sent, ticks, took, before.until(after), nil)
}

// collect waits for every event of a latency phase and summarises.
func (b *bench) collect(ctx context.Context, ph latencyPhase, start map[string]time.Time, ticks int, took time.Duration, use usage, stop <-chan struct{}) (latencyResult, error) {
	want := make(map[string]struct{}, len(start))
	for id := range start {
		want[id] = struct{}{}
	}
	wctx, cancel := context.WithTimeout(ctx, deliveryGrace)
	defer cancel()
	a, err := b.cons.waitIDs(wctx, want, stop)
	if err != nil {
		return latencyResult{}, err
	}
	lat := make([]time.Duration, 0, len(start))
	for id, t0 := range start {
		lat = append(lat, a.at[id].Sub(t0))
	}
	s := summarize(lat)
	if b.opts.verbose {
		printSeries(start, a.at)
	}
	b.cons.reset()
	return latencyResult{
		phase: ph, events: len(start), achieved: float64(ticks*ph.perTx) / took.Seconds(),
		p50: s.p50, p99: s.p99, max: s.max, use: use, duplicates: a.duplicates,
	}, nil
}

// bigTransaction restarts the relay (so its peak RSS is this phase's
// alone), commits opts.backlog events in one transaction and times them
// from COMMIT until the consumer has all of them.
func (b *bench) bigTransaction(ctx context.Context) error {
	n := b.opts.backlog
	if err := b.waitMarked(ctx); err != nil {
		return err
	}
	say("restarting the relay for one transaction of %s events", toolkit.Thousands(n))
	if err := b.stopRelay(ctx, b.relay); err != nil {
		return err
	}
	rp, err := b.startRelay(ctx, b.relayVars)
	if err != nil {
		return err
	}
	b.defer_("stop relay", func(ctx context.Context) error { return rp.stop(ctx) })
	b.relay = rp
	if err := b.prepare(ctx); err != nil {
		return err
	}
	ids, committed, err := b.ins.insert(ctx, n)
	if err != nil {
		return err
	}
	// The window is the timed one: from COMMIT on, when the walsender
	// replays the transaction to the relay.
	before, err := b.sample(rp.Pid())
	if err != nil {
		return err
	}
	want := make(map[string]struct{}, n)
	for _, id := range ids {
		want[id] = struct{}{}
	}
	wctx, cancel := context.WithTimeout(ctx, deliveryTimeout(n))
	defer cancel()
	a, err := b.cons.waitIDs(wctx, want, rp.Exited())
	if err != nil {
		return errors.Join(err, rp.exitError())
	}
	after, err := b.sample(rp.Pid())
	if err != nil {
		return err
	}
	r := b.res
	r.bigTx = rateResult{events: n, took: a.last.Sub(committed), firstAfter: a.first.Sub(committed), use: before.until(after), duplicates: a.duplicates}
	if r.rssBigTx, err = peakRSS(rp.Pid()); err != nil {
		return err
	}
	b.cons.reset()
	say("  %s ev/s after COMMIT (first delivery %s after it), peak RSS %s", toolkit.Thousands(int(r.bigTx.rate())), toolkit.Ms(r.bigTx.firstAfter), mib(r.rssBigTx))
	// Every row must be marked before the drainer runs, or it would
	// publish the relay's events again.
	if err := b.waitMarked(ctx); err != nil {
		return err
	}
	say("stopping the relay")
	return b.stopRelay(ctx, rp)
}

// pollingDrainer is the baseline: with the relay stopped, a drainer polls
// the outbox every 250 ms for up to 100 rows and publishes them with
// confirms. It drains its own backlog, then idles.
func (b *bench) pollingDrainer(ctx context.Context) error {
	m := b.opts.drainerBacklog
	say("polling drainer (%s tick, LIMIT %d, SKIP LOCKED): backlog of %s events", drainerTick, drainerBatch, toolkit.Thousands(m))
	want, err := b.insertBacklog(ctx, m, nil)
	if err != nil {
		return err
	}
	if err := b.prepare(ctx); err != nil {
		return err
	}
	db, err := pgx.Connect(ctx, b.drainerURL)
	if err != nil {
		return fmt.Errorf("connect drainer: %w", err)
	}
	defer func() { _ = db.Close(context.WithoutCancel(ctx)) }()
	pub, err := newConfirmPublisher(ctx, b.amqpURL, b.opts.inflight)
	if err != nil {
		return err
	}
	b.cons.reset()
	before, err := b.sample(0)
	if err != nil {
		return err
	}
	dctx, stop := context.WithCancel(ctx)
	failed := make(chan struct{})
	var runErr error
	go func() {
		runErr = (&drainer{db: db, pub: pub, exchange: b.exchange}).run(dctx)
		close(failed)
	}()
	defer func() {
		stop()
		<-failed
		_ = pub.finish()
	}()
	wctx, cancel := context.WithTimeout(ctx, time.Minute+time.Duration(m)*5*time.Millisecond)
	defer cancel()
	a, err := b.cons.waitIDs(wctx, want, failed)
	if err != nil {
		return errors.Join(err, runErr)
	}
	after, err := b.sample(0)
	if err != nil {
		return err
	}
	r := b.res
	r.drainer = rateResult{events: m, took: a.last.Sub(before.at), firstAfter: a.first.Sub(before.at), use: before.until(after), duplicates: a.duplicates}
	say("  %s ev/s", toolkit.Thousands(int(r.drainer.rate())))
	b.cons.reset()
	say("drainer idle for %s: counting its statements on the primary", b.opts.idleFor)
	if r.idleDrainer, err = b.idle(ctx, drainerRole); err != nil {
		return err
	}
	return nil
}

// findBroker returns the pid of the local process listening on the
// broker URL's port (the broker's Erlang VM), or 0 when there is none (a
// remote broker): its CPU is then counted in "rest".
func findBroker(amqpURL string) int {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return 0
	}
	port := 5672
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil {
			return 0
		}
	}
	if h := u.Hostname(); h != "127.0.0.1" && h != "localhost" && h != "::1" {
		return 0
	}
	pid, err := listenerPID(port)
	if err != nil {
		return 0
	}
	return pid
}

// runOnce runs a relay subcommand to completion; its output is shown only
// if it fails.
func runOnce(ctx context.Context, bin string, env []string, subcommand string) error {
	var out toolkit.Buffer
	if err := toolkit.Run(ctx, bin, env, subcommand, &out); err != nil {
		return fmt.Errorf("%w\n%s", err, out.String())
	}
	return nil
}

func withUser(raw, user string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	u.User = url.User(user)
	return u.String()
}

// machineInfo is the report's header.
type machineInfo struct {
	date      time.Time
	cpus      int
	model     string
	kernel    string
	memory    string
	goBench   string
	goRelay   string
	postgres  string
	rabbitmq  string
	loadStart string
	loadEnd   string
}

func readMachine(relay string) machineInfo {
	m := machineInfo{date: time.Now().UTC(), cpus: runtime.NumCPU(), goBench: runtime.Version(), model: "unknown",
		kernel: "unknown", memory: "unknown", goRelay: "unknown", postgres: "unknown", rabbitmq: "unknown", loadStart: readLoadAvg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		m.model = parseCPUModel(string(b))
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		if f := strings.Fields(line); len(f) == 3 {
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				m.memory = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
			}
		}
	}
	if info, err := buildInfo(relay); err == nil {
		m.goRelay = info
	}
	return m
}

func buildInfo(path string) (string, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return "", err
	}
	return bi.GoVersion, nil
}

func readLoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// printSeries shows a phase's latency second by second (-v), to tell a
// steady queue from one that grows or from a few stalls.
func printSeries(start, at map[string]time.Time) {
	var t0 time.Time
	for _, t := range start {
		if t0.IsZero() || t.Before(t0) {
			t0 = t
		}
	}
	buckets := map[int][]time.Duration{}
	last := 0
	for id, t := range start {
		sec := int(t.Sub(t0) / time.Second)
		buckets[sec] = append(buckets[sec], at[id].Sub(t))
		last = max(last, sec)
	}
	for sec := 0; sec <= last; sec++ {
		s := summarize(buckets[sec])
		say("    second %2d: %5d events  p50 %-9s p99 %-9s max %s", sec, s.n, toolkit.Ms(s.p50), toolkit.Ms(s.p99), toolkit.Ms(s.max))
	}
}

// watchSendLag prints, every second (-v), how far the walsender is behind
// the WAL (not yet decoded and sent: PostgreSQL's side) and how far the
// relay's confirmed position is behind what was sent (the relay and the
// broker's side).
func (b *bench) watchSendLag(ctx context.Context) {
	db, err := pgx.Connect(ctx, b.superURL)
	if err != nil {
		return
	}
	defer func() { _ = db.Close(context.WithoutCancel(ctx)) }()
	var maxSend, maxFlush int64
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for i := 1; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var send, flush int64
		err := db.QueryRow(ctx, `SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), sent_lsn)), 0)::bigint,
			coalesce(max(pg_wal_lsn_diff(sent_lsn, flush_lsn)), 0)::bigint FROM pg_stat_replication`).Scan(&send, &flush)
		if err != nil {
			return
		}
		maxSend, maxFlush = max(maxSend, send), max(maxFlush, flush)
		if i%10 == 0 {
			say("    WAL not yet sent by the walsender: max %d kB; sent but not confirmed by the relay: max %d kB", maxSend/1024, maxFlush/1024)
			maxSend, maxFlush = 0, 0
		}
	}
}
