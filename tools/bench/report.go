package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

// monitorInterval is the relay's default CDCRELAY_MONITOR_INTERVAL: while
// idle, the monitor's one query per interval is all the relay may run on
// the primary (the janitor runs nothing when there is nothing to mark, and
// retention runs hourly).
const monitorInterval = 15 * time.Second

// rssTarget is the most memory the relay may hold (invariant 6, docs/architecture.md:
// memory bounded by the in-flight window).
const rssTarget = 64 << 20

// partitionTarget is the least speed-up of the partitioned drain with
// opts.channels publish channels over the same drain with one channel.
const partitionTarget = 1.3

// rateResult is a timed delivery of a known set of events.
type rateResult struct {
	events     int
	took       time.Duration // from the start (or COMMIT) until the consumer had every event
	firstAfter time.Duration // from the start until the first event arrived
	use        usage
	duplicates int
}

func (r rateResult) rate() float64 {
	if r.took <= 0 {
		return 0
	}
	return float64(r.events) / r.took.Seconds()
}

// per10k scales a CPU time spent on r's events to 10,000 events.
func (r rateResult) per10k(d time.Duration) float64 {
	if r.events == 0 {
		return 0
	}
	return d.Seconds() / float64(r.events) * 10_000
}

// latencyResult is one paced phase.
type latencyResult struct {
	phase         latencyPhase
	events        int
	achieved      float64 // events/s actually inserted (or published)
	p50, p99, max time.Duration
	use           usage
	duplicates    int
}

// idleResult is what a role ran on the primary while idle.
type idleResult struct {
	calls     int64
	retention int64 // of calls, retention's (a run every CDCRELAY_RETENTION_INTERVAL, the first soon after start)
	window    time.Duration
}

// polling is what the role ran besides retention's scheduled run.
func (i idleResult) polling() int64 { return i.calls - i.retention }

func (i idleResult) perSecond() float64 {
	if i.window <= 0 {
		return 0
	}
	return float64(i.calls) / i.window.Seconds()
}

// idleText is the idle row's value: the rate, the count, and retention's
// share, which the target leaves out (a scheduled run, not polling).
func idleText(i idleResult) string {
	t := fmt.Sprintf("%.3f /s (%d in %s", i.perSecond(), i.calls, i.window.Round(time.Second))
	if i.retention > 0 {
		t += fmt.Sprintf(", %d of them retention's run", i.retention)
	}
	return t + ")"
}

// allowed is the most monitor queries a window can hold: one per interval,
// plus one for a window that straddles two ticks.
func (i idleResult) allowed() int64 {
	return int64(i.window/monitorInterval) + 1
}

type results struct {
	machine       machineInfo
	payloadBytes  int
	ceilings      [2]rateResult
	drain         rateResult
	part          [2]rateResult // the partitioned drain with 1 and with opts.channels publish channels
	partCeiling   rateResult    // the broker ceiling with opts.channels publishers, one per partition queue
	markedAfter   time.Duration // the janitor marked the last row this long after the last delivery
	rssBacklog    int64
	bigTx         rateResult
	rssBigTx      int64
	bigPayload    rateResult // the drain of opts.bigPayloads events of bigPayloadBytes
	rssBigPayload int64
	lat, ref      []latencyResult
	idleRelay     idleResult
	idleDrainer   idleResult
	drainer       rateResult
	passThrough   []string
	standby       standbyResult // the standby part (standby.go)
	relayLog      []string      // what the relays logged (LOG_LEVEL=warn: warnings and errors)
}

// ceiling is the reference throughput: the better of the two ceiling runs
// (one before and one after the relay's drain). Other load on the machine
// only ever lowers a ceiling, so the better run is the closer estimate, and
// the stricter reference for the relay.
func (r *results) ceiling() float64 {
	return r.bestCeiling().rate()
}

// bestCeiling is the ceiling run the reference comes from.
func (r *results) bestCeiling() rateResult {
	if r.ceilings[1].rate() > r.ceilings[0].rate() {
		return r.ceilings[1]
	}
	return r.ceilings[0]
}

// noisyCeiling says the two ceiling runs differ by more than a quarter:
// something else loaded the machine or the broker during one of them.
func (r *results) noisyCeiling() bool {
	a, b := r.ceilings[0].rate(), r.ceilings[1].rate()
	return min(a, b) < 0.75*max(a, b)
}

// ourCPU is the CPU our processes spent per 10,000 messages in a window:
// the broker, PostgreSQL, the relay and the bench (publisher, consumer).
func ourCPU(r rateResult) float64 {
	u := r.use
	return r.per10k(u.broker + u.pg + u.relay + u.bench)
}

var tableHeader = []string{"measure", "relay", "reference", "ratio", "target", "ok"}

// rows is the report's main table.
func (r *results) rows(opts options) [][]string {
	ceil := r.ceiling()
	n := toolkit.Thousands(opts.backlog)
	out := [][]string{
		{fmt.Sprintf("broker ceiling: persistent, confirms, 1 channel, %d in flight", opts.inflight), "",
			fmt.Sprintf("%s msg/s", toolkit.Thousands(int(ceil))), "", "", ""},
		{fmt.Sprintf("drain of a %s-event backlog (relay start → consumer has all)", n),
			evs(r.drain.rate()), "broker ceiling", ratio(r.drain.rate(), ceil), "observation", ""},
	}
	if opts.channels > 1 {
		one, many := r.part[0].rate(), r.part[1].rate()
		out = append(out,
			[]string{fmt.Sprintf("drain, 1 channel → %d queues (%s events over %d keys)", opts.channels, n, opts.channels*keysPerLane),
				evs(one), "broker ceiling", ratio(one, ceil), "", ""},
			[]string{fmt.Sprintf("drain, %d channels → %d queues (CDCRELAY_PUBLISH_CHANNELS=%d)", opts.channels, opts.channels, opts.channels),
				evs(many), evs(one) + " 1 channel", ratio(many, one), fmt.Sprintf("≥ %.2f", partitionTarget), ok(one > 0 && many >= partitionTarget*one)},
			[]string{fmt.Sprintf("broker ceiling, %d publishers (connection + confirm channel each) → %d queues", opts.channels, opts.channels),
				"", evs(r.partCeiling.rate()) + " vs 1 channel", ratio(r.partCeiling.rate(), ceil), "", ""})
	}
	out = append(out, [][]string{
		{fmt.Sprintf("one %s-row transaction (COMMIT → consumer has all)", n),
			evs(r.bigTx.rate()), "broker ceiling", ratio(r.bigTx.rate(), ceil), "", ""},
	}...)
	for i, l := range r.lat {
		ref := r.ref[i]
		name := fmt.Sprintf("%s ev/s, %d/tx", toolkit.Thousands(l.phase.rate), l.phase.perTx)
		out = append(out,
			[]string{"commit → consumer p50, " + name, toolkit.Ms(l.p50), toolkit.Ms(ref.p50) + " broker alone", ratio(l.p50.Seconds(), ref.p50.Seconds()), "", ""},
			[]string{"commit → consumer p99, " + name, toolkit.Ms(l.p99), toolkit.Ms(ref.p99) + " broker alone", ratio(l.p99.Seconds(), ref.p99.Seconds()), "", ""},
			[]string{"commit → consumer max, " + name, toolkit.Ms(l.max), toolkit.Ms(ref.max) + " broker alone", ratio(l.max.Seconds(), ref.max.Seconds()), "", ""},
			[]string{"paced insert rate achieved, " + name, evs(l.achieved), evs(float64(l.phase.rate)) + " asked", ratio(l.achieved, float64(l.phase.rate)), "", ""},
		)
	}
	relayCPU, drainerCPU := r.drain.per10k(r.drain.use.pg), r.drainer.per10k(r.drainer.use.pg)
	if best := r.bestCeiling(); best.use.broker > 0 {
		out = append(out, []string{"CPU per 10,000 messages moved, RabbitMQ+PostgreSQL+relay+bench (core-s)",
			fmt.Sprintf("%.2f s drain", ourCPU(r.drain)), fmt.Sprintf("%.2f s ceiling", ourCPU(best)), ratio(ourCPU(r.drain), ourCPU(best)), "", ""})
	}
	out = append(out,
		[]string{"backlog drain: relay vs polling drainer", evs(r.drain.rate()), evs(r.drainer.rate()) + " drainer", ratio(r.drain.rate(), r.drainer.rate()), "", ""},
		[]string{fmt.Sprintf("drain of %d events of %d KiB", r.bigPayload.events, bigPayloadBytes>>10), evs(r.bigPayload.rate()), "", "", "", ""},
		[]string{"PostgreSQL CPU s per 10,000 events (draining), whole cluster", fmt.Sprintf("%.3f s", relayCPU), fmt.Sprintf("%.3f s drainer", drainerCPU), ratio(relayCPU, drainerCPU), "", ""},
		[]string{"PostgreSQL statements/s while idle (pg_stat_statements)",
			idleText(r.idleRelay),
			fmt.Sprintf("%.2f /s drainer", r.idleDrainer.perSecond()), ratio(r.idleRelay.perSecond(), r.idleDrainer.perSecond()),
			fmt.Sprintf("≤ 1 per %s (monitor)", monitorInterval), ok(r.idleRelay.polling() <= r.idleRelay.allowed())},
	)
	return out
}

// notes are the details behind the table: the machine, every window's CPU
// and the definitions.
func (r *results) notes(opts options) string {
	m := r.machine
	var b strings.Builder
	fmt.Fprintf(&b, "date:       %s\n", m.date.Format(time.RFC3339))
	fmt.Fprintf(&b, "machine:    %d CPUs, %s, %s RAM, Linux %s, load average %s at start, %s at end\n", m.cpus, m.model, m.memory, m.kernel, m.loadStart, m.loadEnd)
	fmt.Fprintf(&b, "software:   relay built with %s, bench %s, PostgreSQL %s (throwaway cluster, fsync=off), %s\n", m.goRelay, m.goBench, m.postgres, m.broker)
	fmt.Fprintf(&b, "sizes:      backlog %s, %s events of %d KiB, drainer backlog %s, latency phases %s each, idle windows %s, payload %d bytes, %d in flight\n",
		toolkit.Thousands(opts.backlog), toolkit.Thousands(opts.bigPayloads), bigPayloadBytes>>10, toolkit.Thousands(opts.drainerBacklog), opts.latencyFor, opts.idleFor, r.payloadBytes, opts.inflight)
	if len(r.passThrough) > 0 {
		fmt.Fprintf(&b, "relay env:  %s (from the caller's environment)\n", strings.Join(r.passThrough, " "))
	}
	fmt.Fprintf(&b, "ceiling:    run 1 %s msg/s, run 2 %s msg/s (the reference is the better run)", toolkit.Thousands(int(r.ceilings[0].rate())), toolkit.Thousands(int(r.ceilings[1].rate())))
	if r.noisyCeiling() {
		b.WriteString(": NOISY, the runs differ by more than 25%; other load on the machine or the shared broker")
	}
	b.WriteString("\n")
	if best := r.bestCeiling(); best.use.broker > 0 {
		fmt.Fprintf(&b, "CPU cost:   per 10,000 messages, core-seconds of RabbitMQ+PostgreSQL+relay+bench: ceiling %.2f (RabbitMQ %.2f), relay drain %.2f\n"+
			"            (RabbitMQ %.2f, PostgreSQL %.2f, relay %.2f, consumer %.2f): CPU-bound, the drain can reach about %.2f of the ceiling\n",
			ourCPU(best), best.per10k(best.use.broker), ourCPU(r.drain), r.drain.per10k(r.drain.use.broker), r.drain.per10k(r.drain.use.pg),
			r.drain.per10k(r.drain.use.relay), r.drain.per10k(r.drain.use.bench), ourCPU(best)/ourCPU(r.drain))
	}
	fmt.Fprintf(&b, "drain:      %s events in %s, first delivery %s after the relay started, janitor marked the last row %s after the last delivery\n",
		toolkit.Thousands(r.drain.events), r.drain.took.Round(time.Millisecond), toolkit.Ms(r.drain.firstAfter), r.markedAfter.Round(time.Millisecond))
	if opts.channels > 1 {
		fmt.Fprintf(&b, "partition:  %s events round-robin over %d keys bench.part.*, %d per lane of publish.LaneOf, queue i bound to lane i's keys;\n"+
			"            1 channel: all in %s, first delivery %s after start; %d channels: all in %s, first delivery %s after start\n",
			toolkit.Thousands(r.part[0].events), opts.channels*keysPerLane, keysPerLane, r.part[0].took.Round(time.Millisecond), toolkit.Ms(r.part[0].firstAfter),
			opts.channels, r.part[1].took.Round(time.Millisecond), toolkit.Ms(r.part[1].firstAfter))
	}
	fmt.Fprintf(&b, "big tx:     first delivery %s after COMMIT returned (the client reads the RETURNING rows after the commit; ~0), all %s in %s\n",
		toolkit.Ms(r.bigTx.firstAfter), toolkit.Thousands(r.bigTx.events), r.bigTx.took.Round(time.Millisecond))
	fmt.Fprintf(&b, "relay CPU:  %.2f s per 10,000 events draining the backlog, %.2f s in the large transaction", r.drain.per10k(r.drain.use.relay), r.bigTx.per10k(r.bigTx.use.relay))
	if opts.channels > 1 {
		fmt.Fprintf(&b, ", %.2f s partitioned with 1 channel, %.2f s with %d", r.part[0].per10k(r.part[0].use.relay), r.part[1].per10k(r.part[1].use.relay), opts.channels)
	}
	for _, l := range r.lat {
		fmt.Fprintf(&b, ", %.2f s at %s ev/s", rateResult{events: l.events}.per10k(l.use.relay), toolkit.Thousands(l.phase.rate))
	}
	b.WriteString("\n")

	d := r.drain.duplicates + r.bigTx.duplicates + r.bigPayload.duplicates + r.drainer.duplicates + r.part[0].duplicates + r.part[1].duplicates
	for _, l := range r.lat {
		d += l.duplicates
	}
	if d > 0 {
		fmt.Fprintf(&b, "duplicates: %d redelivered events (the relay restarted a session?)\n", d)
	}
	if len(r.relayLog) == 0 {
		b.WriteString("relay log:  nothing at warn level or above (no session restarts, no janitor errors)\n")
	} else {
		fmt.Fprintf(&b, "relay log:  %d lines at warn level or above, the last ones:\n", len(r.relayLog))
		for _, l := range r.relayLog[max(0, len(r.relayLog)-10):] {
			fmt.Fprintf(&b, "            %s\n", l)
		}
	}
	b.WriteString("latency:    consumer arrival minus the time COMMIT returned to the inserting client (one statement per transaction,\n" +
		"            prepared); the broker-alone reference is arrival minus the time just before the publish call, same rate and batching\n\n")
	b.WriteString("where the CPU went (core-seconds; load before = busy cores in the second before the window, the bench idle;\n" +
		"machine = every process on the box; rest = everything else that ran, such as other people's tests on a shared machine):\n\n")
	windows := []namedUsage{
		{"broker ceiling run 1", r.ceilings[0].use},
		{"broker ceiling run 2", r.ceilings[1].use},
		{"relay backlog drain", r.drain.use},
	}
	if opts.channels > 1 {
		windows = append(windows,
			namedUsage{fmt.Sprintf("relay partitioned drain, 1 channel → %d queues", opts.channels), r.part[0].use},
			namedUsage{fmt.Sprintf("relay partitioned drain, %d channels → %d queues", opts.channels, opts.channels), r.part[1].use},
			namedUsage{fmt.Sprintf("broker ceiling, %d publishers → %d queues", opts.channels, opts.channels), r.partCeiling.use})
	}
	windows = append(windows, namedUsage{"relay one large transaction", r.bigTx.use},
		namedUsage{fmt.Sprintf("relay drain of %d KiB payloads", bigPayloadBytes>>10), r.bigPayload.use})
	for i := range r.lat {
		name := fmt.Sprintf("%s ev/s", toolkit.Thousands(r.lat[i].phase.rate))
		windows = append(windows, namedUsage{"relay latency " + name, r.lat[i].use}, namedUsage{"broker-alone latency " + name, r.ref[i].use})
	}
	windows = append(windows, namedUsage{"polling drainer drain", r.drainer.use})
	rows := make([][]string, 0, len(windows))
	for _, w := range windows {
		u := w.u
		machine := u.busyCores * u.wall.Seconds()
		rest := machine - u.pg.Seconds() - u.relay.Seconds() - u.bench.Seconds() - u.broker.Seconds()
		rows = append(rows, []string{w.name, fmt.Sprintf("%.2f", u.background), fmt.Sprintf("%.1f s", u.wall.Seconds()),
			fmt.Sprintf("%.2f of %d cores", u.busyCores, m.cpus),
			fmt.Sprintf("%.1f", machine), fmt.Sprintf("%.1f", u.broker.Seconds()), fmt.Sprintf("%.1f", u.pg.Seconds()),
			fmt.Sprintf("%.1f", u.relay.Seconds()), fmt.Sprintf("%.1f", u.bench.Seconds()), fmt.Sprintf("%.1f", rest)})
	}
	b.WriteString(formatTable([]string{"window", "load before", "wall", "busy", "machine", "RabbitMQ", "PostgreSQL", "relay", "bench", "rest"}, rows))
	return b.String()
}

type namedUsage struct {
	name string
	u    usage
}

// missedTargets lists the measures whose ok column says NO.
func missedTargets(rows [][]string) []string {
	var out []string
	for _, r := range rows {
		if r[len(r)-1] == "NO" {
			out = append(out, r[0])
		}
	}
	return out
}

// summary is a latency distribution.
type summary struct {
	n             int
	p50, p99, max time.Duration
}

func summarize(d []time.Duration) summary {
	if len(d) == 0 {
		return summary{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return summary{n: len(s), p50: toolkit.Percentile(s, 0.50), p99: toolkit.Percentile(s, 0.99), max: s[len(s)-1]}
}

// formatTable renders a Markdown table whose columns line up in a terminal.
func formatTable(header []string, rows [][]string) string {
	width := make([]int, len(header))
	for _, r := range append([][]string{header}, rows...) {
		for i, c := range r {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for i := range header {
			c := ""
			if i < len(cells) {
				c = cells[i]
			}
			b.WriteString(" " + c + strings.Repeat(" ", width[i]-len([]rune(c))) + " |")
		}
		b.WriteString("\n")
	}
	line(header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = strings.Repeat("-", width[i])
	}
	line(sep)
	for _, r := range rows {
		line(r)
	}
	return b.String()
}

// ratio formats a/b, or "n/a" when b is zero.
func ratio(a, b float64) string {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func ok(met bool) string {
	if met {
		return "yes"
	}
	return "NO"
}

func evs(rate float64) string { return toolkit.Thousands(int(math.Round(rate))) + " ev/s" }

func mib(bytes int64) string { return fmt.Sprintf("%.1f MiB", float64(bytes)/(1<<20)) }
