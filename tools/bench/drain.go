package main

// Throughput phases: the broker ceiling, the backlog drain, the partitioned
// drain, and the wait for the janitor to mark what was drained.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

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

// waitMarked waits until every row is marked published_at. It counts only
// rows enqueued since b.markedBelow, below which every row is known to be
// marked: on the HOT layout (standbylayout.go) no index finds unpublished
// rows, and a count over the whole table would scan it every 50 ms inside
// a drain's window. The bound is the outbox's own (migrations: enqueued_at
// DEFAULT now(), which the bench's inserts take): read before the count,
// the start of the oldest transaction open then, or of the statement, bounds the
// enqueued_at of every row the count's snapshot cannot see.
func (b *bench) waitMarked(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var bound time.Time
		if err := b.db.QueryRow(ctx, markedBoundSQL).Scan(&bound); err != nil {
			return fmt.Errorf("wait for the janitor to mark every row published: %w", err)
		}
		var n int
		if err := b.db.QueryRow(ctx, unmarkedSQL, b.markedBelow).Scan(&n); err != nil {
			return fmt.Errorf("wait for the janitor to mark every row published: %w", err)
		}
		if n == 0 {
			b.markedBelow = bound
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d rows still unmarked after a minute: %w%s", n, ctx.Err(), b.describeUnmarked())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// The bench's own statements of waitMarked (its connection carries no
// application_name cdcrelay, so pgsplit.go counts it as "other").
const (
	// markedBoundSQL: a row a later snapshot misses is inserted by a
	// transaction open when pg_stat_activity is read or starting after this
	// statement did, so its enqueued_at is at least this.
	markedBoundSQL = `SELECT least(statement_timestamp(), min(xact_start)) FROM pg_stat_activity`
	unmarkedSQL    = `SELECT count(*) FROM event_outbox WHERE published_at IS NULL AND enqueued_at >= $1`
)

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
	if b.caughtUp != nil {
		if err := b.caughtUp(ctx); err != nil {
			return nil, 0, err
		}
	}
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
