package main

// The cost-target table: the relay's CPU per event, the PostgreSQL CPU it
// causes against the polling drainer's, p99 against the broker alone,
// peak RSS and the capacity of one core, each against its reference and
// target; and the split of PostgreSQL's CPU by process behind them.

import (
	"fmt"
	"strings"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

const (
	// drainCPUTarget is the most relay CPU per event while draining a backlog.
	drainCPUTarget = 12 * time.Microsecond
	// pgBehalfTarget is the most PostgreSQL CPU per event spent for the
	// relay, as a fraction of the polling drainer's.
	pgBehalfTarget = 0.8
)

// before is where each measure stood on main before this work, for the reader.
var before = map[string]string{
	"1000x1": "265 µs on main", "5000x10": "60 µs on main", "drain": "22 µs on main",
}

var targetHeader = []string{"measure", "value", "reference", "ratio", "target", "met"}

// perEvent is d spread over events, 0 when there were none.
func perEvent(d time.Duration, events int) time.Duration {
	if events <= 0 {
		return 0
	}
	return d / time.Duration(events)
}

// capacity is the events per second one dedicated core sustains at cpu
// per event.
func capacity(cpu time.Duration) float64 {
	if cpu <= 0 {
		return 0
	}
	return float64(time.Second) / float64(cpu)
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond)) }

// atMost is the met column of a measure that must not exceed limit; an
// unmeasured one (0) is not met.
func atMost(v, limit float64) string { return ok(v > 0 && v <= limit) }

// phase returns the paced phase rate x perTx, if it ran.
func (r *results) phase(rate, perTx int) (latencyResult, latencyResult, bool) {
	for i, l := range r.lat {
		if l.phase.rate == rate && l.phase.perTx == perTx {
			return l, r.ref[i], true
		}
	}
	return latencyResult{}, latencyResult{}, false
}

// targetRows is the table of cost targets.
func (r *results) targetRows(opts options) [][]string {
	drainCPU := perEvent(r.drain.use.relay, r.drain.events)
	out := [][]string{}
	for _, p := range []latencyPhase{{rate: 1000, perTx: 1}, {rate: 5000, perTx: 10}} {
		p.targets = defaultTargets[[2]int{p.rate, p.perTx}]
		name := fmt.Sprintf("%s ev/s, %d/tx", toolkit.Thousands(p.rate), p.perTx)
		l, _, ran := r.phase(p.rate, p.perTx)
		if !ran {
			out = append(out, []string{"relay CPU per event, " + name, "not measured (-phases)", "", "", "", ""})
			continue
		}
		cpu := perEvent(l.use.relay, l.events)
		out = append(out, []string{"relay CPU per event, " + name, us(cpu), before[fmt.Sprintf("%dx%d", p.rate, p.perTx)], "",
			"≤ " + us(p.targets.relayCPU), atMost(float64(cpu), float64(p.targets.relayCPU))})
	}
	out = append(out, []string{"relay CPU per event, draining", us(drainCPU), before["drain"], "", "≤ " + us(drainCPUTarget), atMost(float64(drainCPU), float64(drainCPUTarget))})

	drainer := perEvent(r.drainer.use.pgSplit.cpu[classDrainer], r.drainer.events)
	ref := us(drainer) + " polling drainer"
	pgRow := func(name string, u usage, events int) []string {
		v := perEvent(u.pgSplit.relaysBehalf(), events)
		return []string{"PostgreSQL CPU per event for the relay (walsender+janitor+monitor), " + name, us(v), ref,
			ratio(float64(v), float64(drainer)), fmt.Sprintf("≤ %.2f", pgBehalfTarget), atMost(float64(v), pgBehalfTarget*float64(drainer))}
	}
	out = append(out, pgRow("draining", r.drain.use, r.drain.events))
	if l, _, ran := r.phase(1000, 1); ran {
		out = append(out, pgRow("1,000 ev/s", l.use, l.events))
	}
	for _, p := range []latencyPhase{{rate: 1000, perTx: 1}, {rate: 5000, perTx: 10}} {
		l, b, ran := r.phase(p.rate, p.perTx)
		if !ran {
			continue
		}
		limit := defaultTargets[[2]int{p.rate, p.perTx}].p99Ratio
		out = append(out, []string{fmt.Sprintf("p99 commit → consumer, %s ev/s, %d/tx", toolkit.Thousands(p.rate), p.perTx), toolkit.Ms(l.p99),
			toolkit.Ms(b.p99) + " broker alone", ratio(l.p99.Seconds(), b.p99.Seconds()), fmt.Sprintf("≤ %.1f×", limit),
			atMost(l.p99.Seconds(), limit*b.p99.Seconds())})
	}
	n := toolkit.Thousands(opts.backlog)
	for _, m := range []struct {
		name string
		rss  int64
	}{
		{fmt.Sprintf("relay peak RSS, %s-event backlog", n), r.rssBacklog},
		{fmt.Sprintf("relay peak RSS, one %s-row transaction", n), r.rssBigTx},
		{fmt.Sprintf("relay peak RSS, backlog of %s events of %d KiB", toolkit.Thousands(r.bigPayload.events), bigPayloadBytes>>10), r.rssBigPayload},
	} {
		out = append(out, []string{m.name, mib(m.rss), "", "", "≤ " + mib(rssTarget), atMost(float64(m.rss), rssTarget)})
	}
	ceil := r.ceiling()
	out = append(out, []string{"relay capacity on one dedicated core (10^6 / µs per event draining)", evs(capacity(drainCPU)),
		evs(ceil) + " broker ceiling", ratio(capacity(drainCPU), ceil), "observation", ""})
	explain := "the machine's CPU"
	if best := r.bestCeiling(); best.use.broker > 0 && ourCPU(r.drain) > 0 {
		explain = fmt.Sprintf("CPU-bound: the sum predicts %.2f", ourCPU(best)/ourCPU(r.drain))
	}
	out = append(out, []string{"drain / one-channel broker ceiling", ratio(r.drain.rate(), ceil), explain, "", "observation", ""})
	return out
}

// splitNotes is the split of PostgreSQL's CPU by process in each window
// where the relay or the drainer moved events, per event.
func (r *results) splitNotes() string {
	var b strings.Builder
	b.WriteString("PostgreSQL CPU by process, µs per event (backends classified from pg_stat_activity: walsender by backend_type;\n" +
		"janitor and monitor, which share application_name cdcrelay, by their last statement; \"relay, other\" = the relay's\n" +
		"slot-lock and set-up connections; inserter = the bench's inserting backend, not on the relay's behalf; other = postmaster,\n" +
		"checkpointer, autovacuum, the bench's own statements and backends that exited inside the window; (n) = backends of that\n" +
		"class alive at the window's end; a backend's CPU from /proc/<pid>/schedstat, the cluster's total from /proc/<pid>/stat):\n\n")
	type win struct {
		name   string
		u      usage
		events int
	}
	wins := []win{{"relay backlog drain", r.drain.use, r.drain.events}}
	for _, l := range r.lat {
		wins = append(wins, win{fmt.Sprintf("relay at %s ev/s, %d/tx", toolkit.Thousands(l.phase.rate), l.phase.perTx), l.use, l.events})
	}
	wins = append(wins, win{"relay one large transaction", r.bigTx.use, r.bigTx.events},
		win{fmt.Sprintf("relay drain of %d KiB payloads", bigPayloadBytes>>10), r.bigPayload.use, r.bigPayload.events},
		win{"polling drainer drain", r.drainer.use, r.drainer.events})
	header := []string{"window", "events", "total"}
	for _, c := range pgClasses {
		header = append(header, string(c))
	}
	header = append(header, "relay's behalf")
	rows := make([][]string, 0, len(wins))
	for _, w := range wins {
		row := []string{w.name, toolkit.Thousands(w.events), us(perEvent(w.u.pg, w.events))}
		for _, c := range pgClasses {
			cell := us(perEvent(w.u.pgSplit.cpu[c], w.events))
			if n := w.u.pgSplit.backends[c]; n > 0 && c != classOther {
				cell += fmt.Sprintf(" (%d)", n)
			}
			row = append(row, cell)
		}
		rows = append(rows, append(row, us(perEvent(w.u.pgSplit.relaysBehalf(), w.events))))
	}
	b.WriteString(formatTable(header, rows))
	return b.String()
}
