package main

// The standby part's report (standby.go measures it): its rows of the
// cost-target table, its figures with the slot on the standby against
// the slot on the primary, and each server's CPU by process.

import (
	"fmt"
	"strings"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

// Each server's columns in the split tables: the primary carries the
// service's inserts, the drainer and the physical standby's stream; the
// standby carries replay.
var (
	primaryClasses = []pgClass{classInserter, classWalsender, classJanitor, classMonitor, classRelay, classDrainer, classPhysical, classOther}
	standbyClasses = []pgClass{classWalsender, classJanitor, classMonitor, classRelay, classReplay, classOther}
)

// standbyTarget names the part's target rows.
const standbyTarget = "PostgreSQL primary CPU per event for the relay, slot on a standby (janitor+monitor+slot lock), "

// drainerCPU is the polling drainer's backend CPU per event on the part's
// primary: the reference of its targets.
func (s *standbyResult) drainerCPU() time.Duration {
	return perEvent(s.drainer.use.pgSplit.cpu[classDrainer], s.drainer.events)
}

// pacedReference is the reference of the paced target: the drainer's
// backend per event at the paced phase's rate, under the same insert load
// as the relay's paced phase. A drainer that fell behind that rate (under
// 90% of it) does not stand for a drainer at that rate: its drain is the
// reference then, and the label says why.
func (s *standbyResult) pacedReference() (time.Duration, string) {
	l := s.drainerLat
	if l.events > 0 && l.achieved >= 0.9*float64(standbyPhase.rate) {
		return perEvent(l.use.pgSplit.cpu[classDrainer], l.events), fmt.Sprintf("polling drainer at %s ev/s, same primary", toolkit.Thousands(standbyPhase.rate))
	}
	return s.drainerCPU(), fmt.Sprintf("polling drainer's drain, same primary (paced: %s)", evs(l.achieved))
}

// onPrimary and onStandby are what each server spent on the relay's
// behalf per event in a window: every class onRelaysBehalf, so neither
// the physical standby's stream nor replay.
func onPrimary(u usage, events int) time.Duration { return perEvent(u.pgSplit.relaysBehalf(), events) }
func onStandby(u usage, events int) time.Duration { return perEvent(u.sbSplit.relaysBehalf(), events) }

// targetRows are the part's rows of the cost-target table, each naming
// the layout the relay's phases ran on. A part that did not run says so
// in every row rather than leaving them out.
func (s *standbyResult) targetRows() [][]string {
	limit := fmt.Sprintf("≤ %.2f", pgBehalfTarget)
	name := standbyTarget + s.layout.label() + ", "
	if s.notRun != "" {
		return [][]string{
			{name + "draining", "NOT RUN", firstLine(s.notRun), "", limit, "not run"},
			{name + "1,000 ev/s", "NOT RUN", "(the standby part did not run)", "", limit, "not run"},
		}
	}
	row := func(what string, u usage, events int, drainer time.Duration, ref string) []string {
		v := onPrimary(u, events)
		return []string{name + what, us(v), us(drainer) + " " + ref, ratio(float64(v), float64(drainer)), limit, atMost(float64(v), pgBehalfTarget*float64(drainer))}
	}
	paced, pacedRef := s.pacedReference()
	return [][]string{
		row("draining", s.standbyDrain.use, s.standbyDrain.events, s.drainerCPU(), "polling drainer's drain, same primary"),
		row("1,000 ev/s", s.standbyLat.use, s.standbyLat.events, paced, pacedRef),
		{"p99 commit → consumer, 1,000 ev/s, slot on a standby, " + s.layout.label(), toolkit.Ms(s.standbyLat.p99), toolkit.Ms(s.primaryLat.p99) + " slot on the primary",
			ratio(s.standbyLat.p99.Seconds(), s.primaryLat.p99.Seconds()), "observation", ""},
	}
}

// notes is the part's section of the report.
func (s *standbyResult) notes() string {
	var b strings.Builder
	fmt.Fprintf(&b, "streaming from a standby (CDCRELAY_REPLICATION_URL), the relay's phases on the %s: ", s.layout.label())
	if s.notRun != "" {
		fmt.Fprintf(&b, "NOT RUN\n\n"+
			"    !!! THE STANDBY PART DID NOT RUN: %s\n"+
			"    !!! Its target rows below read NOT RUN; no figure of this report is about a standby.\n", s.notRun)
		return b.String()
	}
	fmt.Fprintf(&b, "a PostgreSQL %s primary and a physical standby of it (throwaway clusters on this\n"+
		"machine, hot_standby_feedback on), the relay with its slot on the standby, then on the primary for reference, and the\n"+
		"polling drainer on the same primary; per event, the CPU on each server spent on the relay's behalf (the physical\n"+
		"standby's own stream and replay are replication the user already pays for, listed apart and not counted):\n\n", s.postgres)
	b.WriteString(formatTable([]string{"measure", "slot on the standby", "slot on the primary", "standby / primary", "note"}, s.rows()))
	fmt.Fprintf(&b, "(replay lag: the time since the primary committed the last transaction the standby has replayed, sampled every\n"+
		"%s on the standby during each paced phase; with the slot on the primary nothing waits for it)\n", replaySampling)
	wins := s.windows()
	b.WriteString("\nthe primary's CPU by process, µs per event (standby's walsender = the physical standby's stream; relay, other = the\n" +
		"slot lock and the session's set-up; inserter = the service's writes):\n\n")
	b.WriteString(splitTable(wins, primaryClasses, func(u usage) (pgSplit, time.Duration) { return u.pgSplit, u.pg }))
	b.WriteString("\nthe standby's CPU by process, µs per event (janitor = its polling for the marks, internal/janitor/replica.go; monitor =\n" +
		"the slot's gauges; replay = startup and walreceiver):\n\n")
	b.WriteString(splitTable(wins, standbyClasses, func(u usage) (pgSplit, time.Duration) { return u.sbSplit, u.sbPG }))
	b.WriteString("\n" + s.hotNotes())
	b.WriteString("\n" + s.originNotes())
	return b.String()
}

// rows compare the slot on the standby with the slot on the primary.
func (s *standbyResult) rows() [][]string {
	sd, pd, sl, pl := s.standbyDrain, s.primaryDrain, s.standbyLat, s.primaryLat
	drainer := "drainer " + us(s.drainerCPU())
	paced, _ := s.pacedReference()
	dl := s.drainerLat
	cmp := func(name string, a, b time.Duration, note string) []string {
		return []string{name, us(a), us(b), ratio(float64(a), float64(b)), note}
	}
	lat := func(name string, a, b time.Duration, note string) []string {
		return []string{name, toolkit.Ms(a), toolkit.Ms(b), ratio(a.Seconds(), b.Seconds()), note}
	}
	physical := func(r rateResult) time.Duration { return perEvent(r.use.pgSplit.cpu[classPhysical], r.events) }
	physicalLat := func(l latencyResult) time.Duration { return perEvent(l.use.pgSplit.cpu[classPhysical], l.events) }
	return [][]string{
		cmp("primary CPU per event for the relay, draining", onPrimary(sd.use, sd.events), onPrimary(pd.use, pd.events), drainer),
		cmp("primary CPU per event for the relay, 1,000 ev/s", onPrimary(sl.use, sl.events), onPrimary(pl.use, pl.events), "drainer "+us(paced)),
		cmp("standby CPU per event for the relay, draining", onStandby(sd.use, sd.events), onStandby(pd.use, pd.events), "walsender + janitor's polling + monitor"),
		cmp("standby CPU per event for the relay, 1,000 ev/s", onStandby(sl.use, sl.events), onStandby(pl.use, pl.events), ""),
		cmp("primary: the standby's walsender per event, draining", physical(sd), physical(pd), "replication already paid for"),
		cmp("primary: the standby's walsender per event, 1,000 ev/s", physicalLat(sl), physicalLat(pl), "replication already paid for"),
		{"backlog drain (relay start → consumer has all)", evs(sd.rate()), evs(pd.rate()), ratio(sd.rate(), pd.rate()), ""},
		lat("commit → consumer p50, 1,000 ev/s, 1/tx", sl.p50, pl.p50, "what replay adds; drainer "+toolkit.Ms(dl.p50)),
		lat("commit → consumer p99, 1,000 ev/s, 1/tx", sl.p99, pl.p99, "what replay adds; drainer "+toolkit.Ms(dl.p99)),
		lat("commit → consumer max, 1,000 ev/s, 1/tx", sl.max, pl.max, ""),
		lat("the standby's replay lag while pacing, p50", s.standbyReplay.p50, s.primaryReplay.p50, "commit → replayed, sampled"),
		lat("the standby's replay lag while pacing, p99", s.standbyReplay.p99, s.primaryReplay.p99, fmt.Sprintf("%d and %d samples", s.standbyReplay.n, s.primaryReplay.n)),
		{"paced insert rate achieved", evs(sl.achieved), evs(pl.achieved), ratio(sl.achieved, pl.achieved), "drainer's phase " + evs(dl.achieved)},
	}
}

// splitWindow is one window of a split table.
type splitWindow struct {
	name   string
	u      usage
	events int
	upd    updateCounts // the outbox's updates on the primary (standbylayout.go)
}

// windows are the part's windows, in the order they ran.
func (s *standbyResult) windows() []splitWindow {
	out := []splitWindow{
		{"polling drainer drain", s.drainer.use, s.drainer.events, s.upd.drainer},
		{"polling drainer: 1,000 ev/s", s.drainerLat.use, s.drainerLat.events, s.upd.drainerLat},
		{"slot on the primary: drain", s.primaryDrain.use, s.primaryDrain.events, s.upd.primaryDrain},
		{"slot on the primary: 1,000 ev/s", s.primaryLat.use, s.primaryLat.events, s.upd.primaryLat},
		{"slot on the standby: drain", s.standbyDrain.use, s.standbyDrain.events, s.upd.standbyDrain},
		{"slot on the standby: 1,000 ev/s", s.standbyLat.use, s.standbyLat.events, s.upd.standbyLat},
	}
	if s.hasOrigin {
		out = append(out,
			splitWindow{"slot on the standby: streamed backlog, MARK_ORIGIN auto", s.originOn.use, s.originOn.events, s.upd.originOn},
			splitWindow{"slot on the standby: streamed backlog, MARK_ORIGIN=off", s.originOff.use, s.originOff.events, s.upd.originOff},
			splitWindow{"slot on the standby: 1,000 ev/s, MARK_ORIGIN=off", s.originOffLat.use, s.originOffLat.events, s.upd.originOffLat})
	}
	return out
}

// splitTable renders each window's CPU per event by class; pick says
// which server's split and total a window's usage holds.
func splitTable(wins []splitWindow, classes []pgClass, pick func(usage) (pgSplit, time.Duration)) string {
	header := []string{"window", "events", "total"}
	for _, c := range classes {
		header = append(header, string(c))
	}
	header = append(header, "relay's behalf")
	rows := make([][]string, 0, len(wins))
	for _, w := range wins {
		split, total := pick(w.u)
		row := []string{w.name, toolkit.Thousands(w.events), us(perEvent(total, w.events))}
		for _, c := range classes {
			cell := us(perEvent(split.cpu[c], w.events))
			if n := split.backends[c]; n > 0 && c != classOther {
				cell += fmt.Sprintf(" (%d)", n)
			}
			row = append(row, cell)
		}
		rows = append(rows, append(row, us(perEvent(split.relaysBehalf(), w.events))))
	}
	return formatTable(header, rows)
}

// originNotes compares the relay streaming from the standby with the
// janitor's marks carrying a replication origin (CDCRELAY_MARK_ORIGIN's
// default, auto, with the grants) and without (off): what the walsender
// saves by not decoding them.
func (s *standbyResult) originNotes() string {
	if !s.hasOrigin {
		return "CDCRELAY_MARK_ORIGIN: this relay binary has no such setting; no comparison.\n"
	}
	seen := "none: the marks carried no origin (no grant, or the relay did not set one up)"
	if len(s.origins) > 0 {
		seen = strings.Join(s.origins, ", ")
	}
	type pair struct {
		name     string
		on, off  usage
		eOn, eOf int
	}
	walsender := func(u usage, n int) time.Duration { return perEvent(u.sbSplit.cpu[classWalsender], n) }
	var rows [][]string
	for _, p := range []pair{
		{"backlog committed while streaming", s.originOn.use, s.originOff.use, s.originOn.events, s.originOff.events},
		{"1,000 ev/s", s.standbyLat.use, s.originOffLat.use, s.standbyLat.events, s.originOffLat.events},
	} {
		for _, m := range []struct {
			name string
			f    func(usage, int) time.Duration
		}{{"standby: the relay's walsender per event, ", walsender}, {"standby CPU per event for the relay, ", onStandby}, {"primary CPU per event for the relay, ", onPrimary}} {
			a, b := m.f(p.on, p.eOn), m.f(p.off, p.eOf)
			rows = append(rows, []string{m.name + p.name, us(a), us(b), ratio(float64(a), float64(b))})
		}
	}
	rows = append(rows, []string{"backlog committed while streaming (first commit → consumer has all)", evs(s.originOn.rate()), evs(s.originOff.rate()), ratio(s.originOn.rate(), s.originOff.rate())})
	var b strings.Builder
	fmt.Fprintf(&b, "CDCRELAY_MARK_ORIGIN, the slot on the standby: its default (auto; the role has the origin functions) against off, each\n"+
		"with a backlog committed while the relay streams (a fresh relay's walsender would first decode again from the slot's\n"+
		"restart point) and the paced phase; the relay's replication origins on the primary: %s\n\n", seen)
	b.WriteString(formatTable([]string{"measure", "auto", "off", "auto / off"}, rows))
	return b.String()
}

// banner is the report's last word on the part when it did not run.
func (s *standbyResult) banner() string {
	if s.notRun == "" {
		return ""
	}
	return "standby part NOT RUN: " + firstLine(s.notRun) + "\n"
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
