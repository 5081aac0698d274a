package main

// Latency phases: paced inserts timed commit → consumer, the broker-alone
// reference at the same rate, and the large transaction.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

// latencyPhase is a paced load: rate events/s in transactions of perTx.
type latencyPhase struct {
	rate, perTx int
	targets     phaseTargets // zero: no targets
}

// phaseTargets are the cost targets for a paced phase.
type phaseTargets struct {
	p99Ratio float64       // most p99 commit → consumer as a multiple of the broker alone's
	relayCPU time.Duration // most relay CPU per event
}

// defaultPhases are the issue's: 1,000 events/s one per transaction, and
// 5,000 events/s ten per transaction.
const defaultPhases = "1000x1,5000x10"

// defaultTargets are the targets for the default phases.
var defaultTargets = map[[2]int]phaseTargets{
	{1000, 1}:  {p99Ratio: 1.5, relayCPU: 100 * time.Microsecond},
	{5000, 10}: {p99Ratio: 2, relayCPU: 25 * time.Microsecond},
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
		out = append(out, latencyPhase{rate: rate, perTx: perTx, targets: defaultTargets[[2]int{rate, perTx}]})
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
	stopWatch := b.watchPaced(ctx)
	ticks, took, err := b.insertPaced(ctx, ph, committed)
	stopWatch()
	if err != nil {
		return latencyResult{}, err
	}
	after, err := b.sample(b.relay.Pid())
	if err != nil {
		return latencyResult{}, err
	}
	return b.collect(ctx, ph, committed, ticks, took, before.until(after), b.relay.Exited())
}

// watchPaced runs b.pacedWatch, if set, until the returned func is
// called, which waits for it to return.
func (b *bench) watchPaced(ctx context.Context) func() {
	if b.pacedWatch == nil {
		return func() {}
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.pacedWatch(wctx)
	}()
	return func() {
		cancel()
		<-done
	}
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
