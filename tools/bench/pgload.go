package main

// Load on PostgreSQL: CPU windows over the relay, walsender and broker,
// the idle phases counting statements, and the polling drainer baseline.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

// window samples the CPU counters at the start and end of a measured phase.
type window struct {
	b        *bench
	relayPID int // 0 when the relay does not run in this window
	at       time.Time
	machine  machineCPU
	pg, self time.Duration
	relay    time.Duration
	broker   time.Duration
	backends map[int]pgProc // the cluster's backends, classified (pgsplit.go)
	// sbPG and sbBackends are the physical standby's, in the standby part
	// (standby.go); zero elsewhere.
	sbPG       time.Duration
	sbBackends map[int]pgProc
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
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if w.backends, err = b.sampleBackends(sctx, b.db); err != nil {
		return w, err
	}
	if sb := b.standby; sb != nil {
		if w.sbPG, err = treeCPU(sb.postmaster); err != nil {
			return w, fmt.Errorf("standby: %w", err)
		}
		if w.sbBackends, err = b.sampleBackends(sctx, sb.db); err != nil {
			return w, fmt.Errorf("standby: %w", err)
		}
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
	pgSplit   pgSplit       // pg by process class (pgsplit.go)
	sbPG      time.Duration // the physical standby, in the standby part
	sbSplit   pgSplit       // sbPG by process class
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
		pgSplit:    splitCPU(w.backends, end.backends, end.pg-w.pg),
		sbPG:       end.sbPG - w.sbPG,
		sbSplit:    splitCPU(w.sbBackends, end.sbBackends, end.sbPG-w.sbPG),
		background: w.background,
	}
}

// idle counts the statements role ran on the primary over opts.idleFor,
// telling retention's statements apart (isRetention): its first run comes
// 10 to 30 s after the relay starts and may fall in the window.
func (b *bench) idle(ctx context.Context, role string) (idleResult, error) {
	time.Sleep(settle)
	c0, err := b.statementCalls(ctx, role)
	if err != nil {
		return idleResult{}, err
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return idleResult{}, ctx.Err()
	case <-time.After(b.opts.idleFor):
	}
	c1, err := b.statementCalls(ctx, role)
	if err != nil {
		return idleResult{}, err
	}
	r := idleResult{window: time.Since(start)}
	for q, n := range c1 {
		n -= c0[q]
		r.calls += n
		if isRetention(q) {
			r.retention += n
		}
	}
	return r, nil
}

// statementCalls is pg_stat_statements' calls of role's statements, by text.
func (b *bench) statementCalls(ctx context.Context, role string) (map[string]int64, error) {
	rows, err := b.db.Query(ctx, `SELECT query, sum(calls)::bigint FROM pg_stat_statements WHERE userid = to_regrole($1) GROUP BY query`, role)
	if err != nil {
		return nil, fmt.Errorf("pg_stat_statements: %w", err)
	}
	calls := map[string]int64{}
	for rows.Next() {
		var q string
		var n int64
		if err := rows.Scan(&q, &n); err != nil {
			return nil, fmt.Errorf("pg_stat_statements: %w", err)
		}
		calls[q] = n
	}
	return calls, rows.Err()
}

// isRetention tells the retention run's statements from the others.
func isRetention(query string) bool { return containsAny(query, retentionSQL) }

// pollingDrainer is the baseline: with the relay stopped, a drainer polls
// the outbox every 250 ms for up to 100 rows and publishes them with
// confirms. It drains its own backlog, then idles.
func (b *bench) pollingDrainer(ctx context.Context) error {
	r := b.res
	var err error
	r.drainer, err = b.drainerDrain(ctx, func() error {
		say("drainer idle for %s: counting its statements on the primary", b.opts.idleFor)
		var err error
		r.idleDrainer, err = b.idle(ctx, drainerRole)
		return err
	})
	return err
}

// drainerDrain times the polling drainer over a backlog of
// opts.drainerBacklog events; then, if idle is not nil, runs it while the
// drainer still polls.
func (b *bench) drainerDrain(ctx context.Context, idle func() error) (rateResult, error) {
	m := b.opts.drainerBacklog
	say("polling drainer (%s tick, LIMIT %d, SKIP LOCKED): backlog of %s events", drainerTick, drainerBatch, toolkit.Thousands(m))
	want, err := b.insertBacklog(ctx, m, nil)
	if err != nil {
		return rateResult{}, err
	}
	if err := b.prepare(ctx); err != nil {
		return rateResult{}, err
	}
	d, err := b.startDrainer(ctx, drainerBatch)
	if err != nil {
		return rateResult{}, err
	}
	defer d.stop()
	b.cons.reset()
	before, err := b.sample(0)
	if err != nil {
		return rateResult{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute+time.Duration(m)*5*time.Millisecond)
	defer cancel()
	a, err := b.cons.waitIDs(wctx, want, d.failed)
	if err != nil {
		return rateResult{}, errors.Join(err, d.runErr())
	}
	after, err := b.sample(0)
	if err != nil {
		return rateResult{}, err
	}
	res := rateResult{events: m, took: a.last.Sub(before.at), firstAfter: a.first.Sub(before.at), use: before.until(after), duplicates: a.duplicates}
	say("  %s ev/s", toolkit.Thousands(int(res.rate())))
	b.cons.reset()
	if idle != nil {
		return res, idle()
	}
	return res, nil
}

// drainerPaced runs the polling drainer (limit pacedDrainerBatch, so that
// it keeps up) while the paced inserter commits at the phase's rate: the
// drainer's cost per event under the same load as the relay's paced phase,
// the window being the inserting one as there. Latency is measured as for
// the relay, commit to consumer.
func (b *bench) drainerPaced(ctx context.Context, ph latencyPhase) (latencyResult, error) {
	say("polling drainer (%s tick, LIMIT %d) at %s ev/s (%d per transaction) for %s", drainerTick, pacedDrainerBatch,
		toolkit.Thousands(ph.rate), ph.perTx, b.opts.latencyFor)
	if err := b.prepare(ctx); err != nil {
		return latencyResult{}, err
	}
	d, err := b.startDrainer(ctx, pacedDrainerBatch)
	if err != nil {
		return latencyResult{}, err
	}
	defer d.stop()
	b.cons.reset()
	committed := make(map[string]time.Time, b.opts.latencyFor.Milliseconds()*int64(ph.rate)/1000)
	before, err := b.sample(0)
	if err != nil {
		return latencyResult{}, err
	}
	ticks, took, err := b.insertPaced(ctx, ph, committed)
	if err != nil {
		return latencyResult{}, err
	}
	after, err := b.sample(0)
	if err != nil {
		return latencyResult{}, err
	}
	res, err := b.collect(ctx, ph, committed, ticks, took, before.until(after), d.failed)
	if err != nil {
		return latencyResult{}, errors.Join(err, d.runErr())
	}
	say("  p50 %s p99 %s (inserted at %.0f ev/s)", toolkit.Ms(res.p50), toolkit.Ms(res.p99), res.achieved)
	return res, nil
}

// runningDrainer is a polling drainer in its own goroutine.
type runningDrainer struct {
	failed <-chan struct{} // closed when run returns
	err    error           // run's error: read only once failed is closed (runErr)
	stop   func()          // ends it and waits, then closes its connections
}

// runErr is run's error if it has returned, else nil.
func (d *runningDrainer) runErr() error {
	select {
	case <-d.failed:
		return d.err
	default:
		return nil
	}
}

// startDrainer connects the drainer's role and a confirm publisher and
// runs a drainer claiming limit rows a tick.
func (b *bench) startDrainer(ctx context.Context, limit int) (*runningDrainer, error) {
	db, err := pgx.Connect(ctx, b.drainerURL)
	if err != nil {
		return nil, fmt.Errorf("connect drainer: %w", err)
	}
	pub, err := newConfirmPublisher(ctx, b.amqpURL, b.opts.inflight)
	if err != nil {
		_ = db.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	dctx, cancel := context.WithCancel(ctx)
	failed := make(chan struct{})
	d := &runningDrainer{failed: failed}
	go func() {
		d.err = (&drainer{limit: limit, db: db, pub: pub, exchange: b.exchange}).run(dctx)
		close(failed)
	}()
	d.stop = func() {
		cancel()
		<-failed
		_ = pub.finish()
		_ = db.Close(context.WithoutCancel(ctx))
	}
	return d, nil
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
