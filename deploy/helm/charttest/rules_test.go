package charttest

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The alert rule tests: the chart's PrometheusRule is rendered for several value
// sets, its spec.groups become a rule file, and promtool evaluates it over synthetic
// series shaped like the relay's (docs/architecture.md): every replica exports
// cdcrelay_role and the monitor's holder/last-success gauges; only the replica that
// holds the monitor lock with a fresh refresh exports the slot and backlog gauges.

const runbookBase = "https://github.com/cdcrelay/cdcrelay/blob/main/docs/runbook.md"

// defaultSeverity is the severity of each alert with the chart's default values.
var defaultSeverity = map[string]string{
	"CdcrelayNoStreamingRelay":        "critical",
	"CdcrelayNoStandby":               "warning",
	"CdcrelaySlotRetainedWalHigh":     "warning",
	"CdcrelaySlotNearInvalidation":    "critical",
	"CdcrelaySlotLost":                "critical",
	"CdcrelayOldestUnpublishedTooOld": "critical",
	"CdcrelayOtherRelayOnDatabase":    "warning",
	"CdcrelaySlotForeignHolder":       "critical",
	"CdcrelayParkedRows":              "warning",
	"CdcrelayUnroutableStall":         "critical",
	"CdcrelayDeadLetterFailed":        "warning",
	"CdcrelayForeignInsertsSkipped":   "warning",
	"CdcrelayMessagesNacked":          "warning",
	"CdcrelayRestartStorm":            "warning",
	"CdcrelayBrokerBlocked":           "warning",
	"CdcrelayMonitorStale":            "warning",
	"CdcrelayMarkingFailing":          "warning",
	"CdcrelayEndToEndSlow":            "warning",
	"CdcrelayRetentionFailing":        "warning",
}

// replica is one relay pod's series over 40 minutes at a 1m interval.
type replica struct {
	target string // the scrape target's labels, e.g. namespace="svc",service="...",pod="..."
	slot   string
	role   string // the role it reports throughout; "" exports no role series
	// holder: it holds the monitor lock and refreshes, so it exports the slot and
	// backlog gauges and a last-success timestamp that keeps up with time.
	holder bool
	// set replaces (or with "" removes) the values of a series, keyed by the metric
	// name with its extra labels as they are generated: `cdcrelay_slot_wal_status{status="lost"}`.
	set map[string]string
	// steps is how many 1m steps the default series last (0: 40).
	steps int
}

// slotLabelled are the metrics with the relay's constant slot label.
var slotLabelled = map[string]bool{
	"cdcrelay_role": true, "cdcrelay_monitor_holder": true, "cdcrelay_monitor_last_success_timestamp_seconds": true,
	"cdcrelay_monitor_errors_total": true, "cdcrelay_outbox_unpublished": true, "cdcrelay_outbox_parked": true,
	"cdcrelay_oldest_unpublished_age_seconds": true, "cdcrelay_slot_retained_wal_bytes": true,
	"cdcrelay_slot_lag_bytes": true, "cdcrelay_slot_safe_wal_size_bytes": true, "cdcrelay_slot_wal_status": true,
	"cdcrelay_slot_lost_total": true, "cdcrelay_backfill_events_total": true, "cdcrelay_other_relay_slots": true,
	// Since the alerts name their slot, the other metrics they read have it too.
	"cdcrelay_nacks_total": true, "cdcrelay_poison_events_total": true, "cdcrelay_broker_blocked": true,
	"cdcrelay_commit_to_ack_seconds": true, "cdcrelay_stalled_event_info": true, "cdcrelay_dead_letter_failures_total": true,
	"cdcrelay_foreign_inserts_skipped_total": true, "cdcrelay_pipeline_restarts_total": true, "cdcrelay_marks_failing_seconds": true,
	"cdcrelay_retention_errors_total": true, "cdcrelay_retention_runs_total": true, "cdcrelay_retention_last_success_timestamp_seconds": true,
	"cdcrelay_status": true,
}

func (r replica) series() []inputSeries {
	v := r.defaults()
	for k, val := range r.set {
		if val == "" {
			delete(v, k)
		} else {
			v[k] = val
		}
	}
	var out []inputSeries
	for _, k := range slices.Sorted(maps.Keys(v)) {
		name, extra, _ := strings.Cut(strings.TrimSuffix(k, "}"), "{")
		labels := r.target
		if slotLabelled[strings.TrimSuffix(name, "_bucket")] {
			labels += fmt.Sprintf(",slot=%q", r.slot)
		}
		if extra != "" {
			labels += "," + extra
		}
		out = append(out, inputSeries{Series: name + "{" + labels + "}", Values: v[k]})
	}
	return out
}

// defaults are the replica's series before set: written for 40 steps, stretched to steps.
func (r replica) defaults() map[string]string {
	v := map[string]string{
		"cdcrelay_monitor_holder":                         "0x40",
		"cdcrelay_monitor_last_success_timestamp_seconds": "0x40", // never refreshed
		"cdcrelay_monitor_errors_total":                   "0x40",
		"cdcrelay_returns_total":                          "0x40",
		"cdcrelay_nacks_total":                            "0x40",
		"cdcrelay_pipeline_restarts_total":                "0x40",
		"cdcrelay_poison_events_total":                    "0x40",
		"cdcrelay_janitor_errors_total":                   "0x40",
		"cdcrelay_marks_failing_seconds":                  "0x40",
		"cdcrelay_slot_lost_total":                        "0x40",
		"cdcrelay_backfill_events_total":                  "0x40",
		"cdcrelay_broker_blocked":                         "0x40",
		"cdcrelay_foreign_inserts_skipped_total":          "0x40",
		// Retention never ran and never failed; a last success of 0 is "none yet".
		"cdcrelay_retention_errors_total":                   "0x40",
		"cdcrelay_retention_runs_total":                     "0x40",
		"cdcrelay_retention_last_success_timestamp_seconds": "0x40",
		// The relay creates the three outcomes at 0.
		`cdcrelay_dead_letter_failures_total{outcome="returned"}`: "0x40",
		`cdcrelay_dead_letter_failures_total{outcome="nacked"}`:   "0x40",
		`cdcrelay_dead_letter_failures_total{outcome="refused"}`:  "0x40",
		// Every event confirmed within 100ms.
		`cdcrelay_commit_to_ack_seconds_bucket{le="0.1"}`:  "0+10x40",
		`cdcrelay_commit_to_ack_seconds_bucket{le="1"}`:    "0+10x40",
		`cdcrelay_commit_to_ack_seconds_bucket{le="5"}`:    "0+10x40",
		`cdcrelay_commit_to_ack_seconds_bucket{le="+Inf"}`: "0+10x40",
	}
	if r.role != "" {
		// Every relay exports each reason; the one that holds none of its
		// own (as here) is 0.
		v[`cdcrelay_status{reason="slot_foreign"}`] = "0x40"
		for _, role := range []string{"starting", "streaming", "standby"} {
			val := "0x40"
			if role == r.role {
				val = "1x40"
			}
			v[fmt.Sprintf(`cdcrelay_role{role=%q}`, role)] = val
		}
	}
	if r.holder {
		maps.Copy(v, map[string]string{
			"cdcrelay_monitor_holder":                         "1x40",
			"cdcrelay_monitor_last_success_timestamp_seconds": "0+60x40", // refreshed at every step
			"cdcrelay_slot_retained_wal_bytes":                "1048576x40",
			"cdcrelay_slot_lag_bytes":                         "1024x40",
			"cdcrelay_slot_safe_wal_size_bytes":               "-1x40",
			`cdcrelay_slot_wal_status{status="reserved"}`:     "1x40",
			`cdcrelay_slot_wal_status{status="extended"}`:     "0x40",
			`cdcrelay_slot_wal_status{status="unreserved"}`:   "0x40",
			`cdcrelay_slot_wal_status{status="lost"}`:         "0x40",
			"cdcrelay_outbox_unpublished":                     "0x40",
			"cdcrelay_outbox_parked":                          "0x40",
			"cdcrelay_oldest_unpublished_age_seconds":         "0x40",
			"cdcrelay_other_relay_slots":                      "0x40",
		})
	}
	if r.steps > 0 {
		for k, val := range v {
			v[k] = strings.TrimSuffix(val, "x40") + fmt.Sprintf("x%d", r.steps)
		}
	}
	return v
}

// operatorTarget is a target's labels as the chart's ServiceMonitor gives them.
func operatorTarget(service, source, pod string) string {
	return fmt.Sprintf(`namespace=%q,service=%q,source=%q,job=%q,pod=%q,instance="%s:8080"`,
		namespace, service, source, service, service+"-"+pod, pod)
}

// customTarget is a target that only a custom selector (job="cdcrelay") finds.
func customTarget(pod string) string {
	return fmt.Sprintf(`job="cdcrelay",pod=%q,instance="%s:8080"`, pod, pod)
}

// ruleVariant is one rendered value set and the labels its alerts carry.
type ruleVariant struct {
	name      string
	files     []string
	set       []string
	extra     map[string]string // alertLabels
	custom    bool              // custom selector: series have no namespace/service
	scenarios []ruleScenario
}

// source describes one configured source, for expected labels.
type source struct{ service, slot, name string }

var (
	orders  = source{"rel-cdcrelay-orders", "cdcrelay_orders", "orders"}
	billing = source{"rel-cdcrelay-billing", "cdcrelay_billing", "billing"}
	single  = source{"rel-cdcrelay", "cdcrelay_outbox", "default"}
)

func (v ruleVariant) labels(alert string, l map[string]string) map[string]string {
	out := map[string]string{"severity": defaultSeverity[alert]}
	maps.Copy(out, v.extra)
	maps.Copy(out, l)
	return out
}

// perSource: a per-source rule's static labels.
func (v ruleVariant) perSource(alert string, s source) map[string]string {
	return v.labels(alert, map[string]string{"namespace": namespace, "service": s.service, "slot": s.slot, "source": s.name})
}

// bySlot: an aggregated alert. Every metric the alerts read carries the slot, and
// the rule names the source of that slot whether or not the scrape attached one
// (a custom selector's targets have no namespace, service or source).
func (v ruleVariant) bySlot(alert string, s source) map[string]string {
	if v.custom {
		return v.labels(alert, map[string]string{"slot": s.slot, "source": s.name})
	}
	return v.labels(alert, map[string]string{"namespace": namespace, "service": s.service, "source": s.name, "slot": s.slot})
}

// with adds labels to an alert's label set.
func with(l map[string]string, extra map[string]string) map[string]string {
	out := maps.Clone(l)
	maps.Copy(out, extra)
	return out
}

// stalledRow is a row the stream stalls on: the labels of cdcrelay_stalled_event_info.
type stalledRow struct{ id, exchange, key, cause string }

// series is the info series' name and labels, as a replica.set key.
func (r stalledRow) series() string {
	return fmt.Sprintf(`cdcrelay_stalled_event_info{id=%q,exchange=%q,routing_key=%q,cause=%q}`, r.id, r.exchange, r.key, r.cause)
}

// labels are the row's labels on CdcrelayUnroutableStall.
func (r stalledRow) labels() map[string]string {
	return map[string]string{"id": r.id, "exchange": r.exchange, "routing_key": r.key, "cause": r.cause}
}

var (
	noRoute    = stalledRow{"0190a4c2-7d1e-7b4a-9f00-3c1d2e4f5a6b", "events", "orders.refunded", "no_route"}
	noExchange = stalledRow{"1042", "billing.v2", "invoice.issued", "no_exchange"}
)

// ruleScenario is one promtool test group: series and the alerts expected at some
// evaluation times. At each of those times every alert not listed must be silent.
type ruleScenario struct {
	name     string
	replicas []replica
	fire     []firing
	quietAt  []string
	// fullAnnotations: test against the rules as rendered and expect these
	// annotations (alert name -> annotations); otherwise annotations are reduced to
	// runbook_url, which every expected alert must carry.
	fullAnnotations map[string]map[string]string
}

// firing: alert fires at `at` with exactly these label sets.
type firing struct {
	at     string
	alert  string
	labels []map[string]string
}

func fire(at, alert string, labels ...map[string]string) firing {
	return firing{at: at, alert: alert, labels: labels}
}

// alertNames returns the distinct alert names of the groups, in order.
func alertNames(groups []RuleGroup) []string {
	var names []string
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Alert != "" && !slices.Contains(names, r.Alert) {
				names = append(names, r.Alert)
			}
		}
	}
	return names
}

// testGroupFor turns a scenario into a promtool test group over the alerts names.
func (s ruleScenario) testGroupFor(names []string) testGroup {
	tg := testGroup{Interval: "1m"}
	for _, r := range s.replicas {
		tg.InputSeries = append(tg.InputSeries, r.series()...)
	}
	listed := map[string]bool{}
	times := slices.Clone(s.quietAt)
	for _, f := range s.fire {
		listed[f.at+"/"+f.alert] = true
		if !slices.Contains(times, f.at) {
			times = append(times, f.at)
		}
		c := alertTestCase{EvalTime: f.at, Alertname: f.alert}
		for _, l := range f.labels {
			ann := map[string]string{"runbook_url": runbookBase + "#" + strings.ToLower(f.alert)}
			if s.fullAnnotations != nil {
				ann = s.fullAnnotations[f.alert]
			}
			c.ExpAlerts = append(c.ExpAlerts, expAlert{ExpLabels: l, ExpAnnotations: ann})
		}
		tg.AlertRuleTest = append(tg.AlertRuleTest, c)
	}
	sort.Strings(times)
	for _, at := range times {
		for _, n := range names {
			if !listed[at+"/"+n] {
				tg.AlertRuleTest = append(tg.AlertRuleTest, alertTestCase{EvalTime: at, Alertname: n})
			}
		}
	}
	return tg
}

// runbookOnly returns groups with every rule's annotations reduced to runbook_url, so
// that expectations need not spell out every summary (one scenario checks those).
func runbookOnly(groups []RuleGroup) []RuleGroup {
	out := slices.Clone(groups)
	for i := range out {
		out[i].Rules = slices.Clone(out[i].Rules)
		for j := range out[i].Rules {
			r := &out[i].Rules[j]
			r.Annotations = map[string]string{"runbook_url": r.Annotations["runbook_url"]}
		}
	}
	return out
}

// ruleGroups renders a variant and returns its PrometheusRule's groups.
func ruleGroups(t *testing.T, files []string, set ...string) []RuleGroup {
	t.Helper()
	r := render(t, files, set...)
	checkRelease(t, r)
	if len(r.PrometheusRules) != 1 {
		t.Fatalf("%v: %d PrometheusRules, want 1", files, len(r.PrometheusRules))
	}
	return r.PrometheusRules[0].Spec.Groups
}

func ordersHealthy(target func(pod string) string) []replica {
	return []replica{
		{target: target("a"), slot: orders.slot, role: "streaming", holder: true},
		{target: target("b"), slot: orders.slot, role: "standby"},
	}
}

func billingHealthy(target func(pod string) string) replica {
	return replica{target: target("c"), slot: billing.slot, role: "streaming", holder: true}
}

// ordersWith is the healthy orders pair with series of the streaming pod replaced.
func ordersWith(target func(pod string) string, set map[string]string) []replica {
	rs := ordersHealthy(target)
	rs[0].set = set
	return rs
}

// retentionWith is the healthy orders pair and billing over five hours (retention
// runs hourly at most, and the alert waits for three hours without a success), with
// series of the streaming orders pod replaced.
func retentionWith(target func(pod string) string, billing replica, set map[string]string) []replica {
	rs := append(ordersWith(target, set), billing)
	for i := range rs {
		rs[i].steps = 300
	}
	return rs
}

func svcTarget(s source) func(pod string) string {
	return func(pod string) string { return operatorTarget(s.service, s.name, pod) }
}

func mainScenarios(v ruleVariant) []ruleScenario {
	o, b := svcTarget(orders), svcTarget(billing)
	withBilling := func(rs ...replica) []replica { return append(rs, billingHealthy(b)) }
	const gib2, mib512 = "2147483648x40", "536870912x40"
	return []ruleScenario{
		{name: "healthy, standbys export no slot or backlog gauges, paused source has no series",
			replicas: withBilling(ordersHealthy(o)...), quietAt: []string{"10m", "30m", "40m"}},
		{name: "total outage of orders: every replica starting, the monitor still refreshes",
			replicas: withBilling(
				replica{target: o("a"), slot: orders.slot, role: "starting", holder: true},
				replica{target: o("b"), slot: orders.slot, role: "starting"}),
			quietAt: []string{"3m"},
			fire: []firing{
				fire("10m", "CdcrelayNoStreamingRelay", v.perSource("CdcrelayNoStreamingRelay", orders)),
				fire("30m", "CdcrelayNoStreamingRelay", v.perSource("CdcrelayNoStreamingRelay", orders)),
			}},
		{name: "adoption of orders publishing its backlog: no streamer, but no page while the backfill advances",
			replicas: withBilling(
				replica{target: o("a"), slot: orders.slot, role: "starting", holder: true,
					set: map[string]string{"cdcrelay_backfill_events_total": "0+1000x40"}},
				replica{target: o("b"), slot: orders.slot, role: "standby"}),
			quietAt: []string{"10m", "30m", "40m"}},
		{name: "adoption of orders stalls: the page comes once the backfill stops advancing",
			replicas: withBilling(
				replica{target: o("a"), slot: orders.slot, role: "starting", holder: true,
					set: map[string]string{"cdcrelay_backfill_events_total": "0+1000x10 10000x30"}},
				replica{target: o("b"), slot: orders.slot, role: "standby"}),
			quietAt: []string{"10m"},
			fire:    []firing{fire("25m", "CdcrelayNoStreamingRelay", v.perSource("CdcrelayNoStreamingRelay", orders))}},
		{name: "total outage of orders: no replica scraped at all",
			replicas: withBilling(),
			fire:     []firing{fire("10m", "CdcrelayNoStreamingRelay", v.perSource("CdcrelayNoStreamingRelay", orders))}},
		{name: "orders streams, its second replica is stuck starting",
			replicas: withBilling(
				replica{target: o("a"), slot: orders.slot, role: "streaming", holder: true},
				replica{target: o("b"), slot: orders.slot, role: "starting"}),
			quietAt: []string{"10m"},
			fire:    []firing{fire("20m", "CdcrelayNoStandby", v.perSource("CdcrelayNoStandby", orders))}},
		{name: "orders streams, its second replica is gone",
			replicas: withBilling(replica{target: o("a"), slot: orders.slot, role: "streaming", holder: true}),
			fire:     []firing{fire("20m", "CdcrelayNoStandby", v.perSource("CdcrelayNoStandby", orders))}},
		{name: "retained WAL above the threshold",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_slot_retained_wal_bytes": gib2})...),
			quietAt:  []string{"5m"},
			fire:     []firing{fire("15m", "CdcrelaySlotRetainedWalHigh", v.bySlot("CdcrelaySlotRetainedWalHigh", orders))}},
		{name: "safe WAL size below the threshold",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_slot_safe_wal_size_bytes": mib512})...),
			fire:     []firing{fire("2m", "CdcrelaySlotNearInvalidation", v.bySlot("CdcrelaySlotNearInvalidation", orders))}},
		{name: "wal_status unreserved with max_slot_wal_keep_size unlimited",
			replicas: withBilling(ordersWith(o, map[string]string{
				`cdcrelay_slot_wal_status{status="reserved"}`: "0x40", `cdcrelay_slot_wal_status{status="unreserved"}`: "1x40"})...),
			fire: []firing{fire("2m", "CdcrelaySlotNearInvalidation", v.bySlot("CdcrelaySlotNearInvalidation", orders))}},
		{name: "wal_status unreserved and little WAL left: one alert",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_slot_safe_wal_size_bytes": mib512,
				`cdcrelay_slot_wal_status{status="reserved"}`: "0x40", `cdcrelay_slot_wal_status{status="unreserved"}`: "1x40"})...),
			fire: []firing{fire("2m", "CdcrelaySlotNearInvalidation", v.bySlot("CdcrelaySlotNearInvalidation", orders))}},
		{name: "another relay streams the database of orders (a copied values file): one alert once it lasts 5m",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_other_relay_slots": "0x4 1x36"})...),
			quietAt:  []string{"3m", "7m"},
			fire:     []firing{fire("12m", "CdcrelayOtherRelayOnDatabase", v.bySlot("CdcrelayOtherRelayOnDatabase", orders))}},
		{name: "pg_recvlogical holds the slot of orders: the replica at its retries says slot_foreign, the other waits behind it; one alert before NoStreamingRelay",
			replicas: withBilling(
				replica{target: o("a"), slot: orders.slot, role: "starting", holder: true,
					set: map[string]string{`cdcrelay_status{reason="slot_foreign"}`: "0x1 1x39"}},
				replica{target: o("b"), slot: orders.slot, role: "standby"}),
			quietAt: []string{"1m", "2m"}, // pending for 1m
			fire: []firing{
				fire("4m", "CdcrelaySlotForeignHolder", v.bySlot("CdcrelaySlotForeignHolder", orders)),
				fire("10m", "CdcrelaySlotForeignHolder", v.bySlot("CdcrelaySlotForeignHolder", orders)),
				fire("10m", "CdcrelayNoStreamingRelay", v.perSource("CdcrelayNoStreamingRelay", orders)),
			}},
		{name: "the replicas take turns at the held slot: one alert throughout",
			replicas: withBilling(
				replica{target: o("a"), slot: orders.slot, role: "starting", holder: true,
					set: map[string]string{`cdcrelay_status{reason="slot_foreign"}`: "1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0"}},
				replica{target: o("b"), slot: orders.slot, role: "starting",
					set: map[string]string{`cdcrelay_status{reason="slot_foreign"}`: "0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1"}}),
			fire: []firing{
				fire("4m", "CdcrelaySlotForeignHolder", v.bySlot("CdcrelaySlotForeignHolder", orders)),
				fire("15m", "CdcrelaySlotForeignHolder", v.bySlot("CdcrelaySlotForeignHolder", orders)),
				fire("15m", "CdcrelayNoStreamingRelay", v.perSource("CdcrelayNoStreamingRelay", orders)),
			}},
		{name: "safe WAL size above the threshold",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_slot_safe_wal_size_bytes": "5368709120x40"})...),
			quietAt:  []string{"2m", "20m"}},
		{name: "slot lost: wal_status lost and the relay counted it, one alert",
			replicas: withBilling(ordersWith(o, map[string]string{
				`cdcrelay_slot_wal_status{status="reserved"}`: "1x4 0x36", `cdcrelay_slot_wal_status{status="lost"}`: "0x4 1x36",
				"cdcrelay_slot_lost_total": "0x4 1x36"})...),
			quietAt: []string{"3m"},
			fire:    []firing{fire("10m", "CdcrelaySlotLost", v.bySlot("CdcrelaySlotLost", orders))}},
		{name: "slot lost while the relay was down: a new pod's counter is 1 from its first scrape",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_slot_lost_total": "1x40"})...),
			fire:     []firing{fire("10m", "CdcrelaySlotLost", v.bySlot("CdcrelaySlotLost", orders))}},
		{name: "slot lost and recreated: the counter alone fires for an hour",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_slot_lost_total": "0x4 1x36"})...),
			fire: []firing{
				fire("10m", "CdcrelaySlotLost", v.bySlot("CdcrelaySlotLost", orders)),
				fire("40m", "CdcrelaySlotLost", v.bySlot("CdcrelaySlotLost", orders)),
			}},
		{name: "oldest unpublished row above the threshold",
			replicas: withBilling(ordersWith(o, map[string]string{
				"cdcrelay_oldest_unpublished_age_seconds": "0x4 600x36", "cdcrelay_outbox_unpublished": "0x4 5x36"})...),
			quietAt: []string{"8m"},
			fire:    []firing{fire("15m", "CdcrelayOldestUnpublishedTooOld", v.bySlot("CdcrelayOldestUnpublishedTooOld", orders))}},
		{name: "a parked row fires ParkedRows once and not OldestUnpublishedTooOld",
			replicas: withBilling(ordersWith(o, map[string]string{
				"cdcrelay_outbox_parked": "0x4 1x36", "cdcrelay_poison_events_total": "0x4 1x36"})...),
			fire: []firing{
				fire("10m", "CdcrelayParkedRows", v.bySlot("CdcrelayParkedRows", orders)),
				fire("40m", "CdcrelayParkedRows", v.bySlot("CdcrelayParkedRows", orders)),
			}},
		{name: "a poison event with nothing parked (poison policy stop)",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_poison_events_total": "0x4 1x36"})...),
			quietAt:  []string{"30m"},
			fire:     []firing{fire("6m", "CdcrelayParkedRows", v.bySlot("CdcrelayParkedRows", orders))}},
		{name: "a stall on a row without a binding: the relay retries it, each retry a failed session spent mostly starting",
			replicas: withBilling(
				replica{target: o("a"), slot: orders.slot, role: "starting", holder: true, set: map[string]string{
					noRoute.series(): "_x4 1x36", "cdcrelay_returns_total": "0x4 0+1x36", "cdcrelay_pipeline_restarts_total": "0x4 0+2x36"}},
				replica{target: o("b"), slot: orders.slot, role: "standby"}),
			quietAt: []string{"5m"}, // pending for 2m
			fire: []firing{
				fire("7m", "CdcrelayUnroutableStall", with(v.bySlot("CdcrelayUnroutableStall", orders), noRoute.labels())),
				// NoStreamingRelay and RestartStorm hold off: the stall is the incident.
				fire("20m", "CdcrelayUnroutableStall", with(v.bySlot("CdcrelayUnroutableStall", orders), noRoute.labels())),
				fire("40m", "CdcrelayUnroutableStall", with(v.bySlot("CdcrelayUnroutableStall", orders), noRoute.labels())),
			}},
		{name: "a stall on a row whose exchange does not exist",
			replicas: withBilling(ordersWith(o, map[string]string{noExchange.series(): "1x40"})...),
			quietAt:  []string{"1m"},
			fire:     []firing{fire("10m", "CdcrelayUnroutableStall", with(v.bySlot("CdcrelayUnroutableStall", orders), noExchange.labels()))}},
		{name: "a stall shorter than for: a binding came within a minute",
			replicas: withBilling(ordersWith(o, map[string]string{
				noRoute.series(): "_x4 1x1 stale", "cdcrelay_returns_total": "0x4 1 2x35", "cdcrelay_pipeline_restarts_total": "0x4 1 2x35"})...),
			quietAt: []string{"5m", "6m", "7m", "10m", "30m"}},
		{name: "a stall survives a failover: the standby takes over and stalls on the same row, one alert",
			replicas: withBilling(
				// a's pod is replaced at 10m; the new one waits as the standby.
				replica{target: o("a"), slot: orders.slot, role: "streaming", holder: true, set: map[string]string{
					noRoute.series(): "1x9 stale", `cdcrelay_role{role="streaming"}`: "1x9 0x31", `cdcrelay_role{role="standby"}`: "0x9 1x31"}},
				replica{target: o("b"), slot: orders.slot, role: "standby", set: map[string]string{
					noRoute.series(): "_x10 1x30", `cdcrelay_role{role="streaming"}`: "0x9 1x31", `cdcrelay_role{role="standby"}`: "1x9 0x31"}}),
			fire: []firing{
				fire("5m", "CdcrelayUnroutableStall", with(v.bySlot("CdcrelayUnroutableStall", orders), noRoute.labels())),
				fire("11m", "CdcrelayUnroutableStall", with(v.bySlot("CdcrelayUnroutableStall", orders), noRoute.labels())),
				fire("30m", "CdcrelayUnroutableStall", with(v.bySlot("CdcrelayUnroutableStall", orders), noRoute.labels())),
			}},
		{name: "the stall ends: restarts during it do not make a storm afterwards, and a later outage pages",
			replicas: withBilling(
				replica{target: o("a"), slot: orders.slot, role: "starting", holder: true, set: map[string]string{
					noRoute.series(): "1x14 stale", "cdcrelay_pipeline_restarts_total": "0+2x14 30x25",
					`cdcrelay_role{role="starting"}`: "1x14 0x15 1x10", `cdcrelay_role{role="streaming"}`: "0x14 1x15 0x10"}},
				replica{target: o("b"), slot: orders.slot, role: "standby"}),
			quietAt: []string{"16m", "25m"},
			fire: []firing{
				fire("10m", "CdcrelayUnroutableStall", with(v.bySlot("CdcrelayUnroutableStall", orders), noRoute.labels())),
				fire("38m", "CdcrelayNoStreamingRelay", v.perSource("CdcrelayNoStreamingRelay", orders)),
			}},
		{name: "a stall of billing does not hide an outage of orders",
			replicas: []replica{
				{target: o("a"), slot: orders.slot, role: "starting", holder: true, set: map[string]string{"cdcrelay_pipeline_restarts_total": "0+1x40"}},
				{target: o("b"), slot: orders.slot, role: "starting"},
				{target: b("c"), slot: billing.slot, role: "streaming", holder: true, set: map[string]string{noExchange.series(): "1x40"}}},
			fire: []firing{
				fire("10m", "CdcrelayNoStreamingRelay", v.perSource("CdcrelayNoStreamingRelay", orders)),
				fire("10m", "CdcrelayRestartStorm", v.bySlot("CdcrelayRestartStorm", orders)),
				fire("10m", "CdcrelayUnroutableStall", with(v.bySlot("CdcrelayUnroutableStall", billing), noExchange.labels())),
			}},
		{name: "a dead-letter copy returned: the row is parked too",
			replicas: withBilling(ordersWith(o, map[string]string{
				`cdcrelay_dead_letter_failures_total{outcome="returned"}`: "0x4 1x36",
				"cdcrelay_outbox_parked":                                  "0x5 1x35", "cdcrelay_poison_events_total": "0x4 1x36"})...),
			quietAt: []string{"4m", "25m"}, // 15 minutes after, only the parked row is left
			fire: []firing{
				fire("6m", "CdcrelayDeadLetterFailed", with(v.bySlot("CdcrelayDeadLetterFailed", orders), map[string]string{"outcome": "returned"})),
				fire("6m", "CdcrelayParkedRows", v.bySlot("CdcrelayParkedRows", orders)),
				fire("18m", "CdcrelayDeadLetterFailed", with(v.bySlot("CdcrelayDeadLetterFailed", orders), map[string]string{"outcome": "returned"})),
				fire("18m", "CdcrelayParkedRows", v.bySlot("CdcrelayParkedRows", orders)),
				fire("25m", "CdcrelayParkedRows", v.bySlot("CdcrelayParkedRows", orders)),
			}},
		{name: "dead-letter copies nacked and refused: one alert per outcome",
			replicas: withBilling(ordersWith(o, map[string]string{
				`cdcrelay_dead_letter_failures_total{outcome="nacked"}`:  "0x9 3x31",
				`cdcrelay_dead_letter_failures_total{outcome="refused"}`: "0x9 1x31"})...),
			quietAt: []string{"9m", "30m"},
			fire: []firing{fire("10m", "CdcrelayDeadLetterFailed",
				with(v.bySlot("CdcrelayDeadLetterFailed", orders), map[string]string{"outcome": "nacked"}),
				with(v.bySlot("CdcrelayDeadLetterFailed", orders), map[string]string{"outcome": "refused"}))}},
		{name: "foreign inserts skipped: fires for 15 minutes after the last, with its description",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_foreign_inserts_skipped_total": "0x4 2x36"})...),
			quietAt:  []string{"4m", "25m"},
			fire: []firing{
				fire("6m", "CdcrelayForeignInsertsSkipped", v.bySlot("CdcrelayForeignInsertsSkipped", orders)),
				fire("18m", "CdcrelayForeignInsertsSkipped", v.bySlot("CdcrelayForeignInsertsSkipped", orders)),
			},
			fullAnnotations: map[string]map[string]string{
				"CdcrelayForeignInsertsSkipped": {
					"summary":     "The publication of svc/rel-cdcrelay-orders publishes a table that is not the outbox",
					"description": `The relay skipped 2 inserts within 15 minutes from a table of its publication that is provably not the outbox (its log names the table: "skipping inserts into ..."). The outbox's events keep flowing (no event is lost), but the walsender decodes and sends every row of that table to the relay, which discards it. Remove the table from the relay's publication (ALTER PUBLICATION ... DROP TABLE): ` + runbookBase + "#cdcrelayforeigninsertsskipped",
					"runbook_url": runbookBase + "#cdcrelayforeigninsertsskipped",
				},
			}},
		{name: "nacks keep coming",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_nacks_total": "0+1x40"})...),
			quietAt:  []string{"3m"},
			fire:     []firing{fire("10m", "CdcrelayMessagesNacked", v.bySlot("CdcrelayMessagesNacked", orders))}},
		{name: "one nack",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_nacks_total": "0x4 1x36"})...),
			quietAt:  []string{"7m", "9m", "12m"}},
		{name: "restart storm",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_pipeline_restarts_total": "0+1x40"})...),
			fire:     []firing{fire("10m", "CdcrelayRestartStorm", v.bySlot("CdcrelayRestartStorm", orders))}},
		{name: "two restarts",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_pipeline_restarts_total": "0x4 1x4 2x31"})...),
			quietAt:  []string{"10m", "20m"}},
		{name: "broker blocks publishers",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_broker_blocked": "0x4 1x36"})...),
			quietAt:  []string{"8m"},
			fire:     []firing{fire("15m", "CdcrelayBrokerBlocked", v.bySlot("CdcrelayBrokerBlocked", orders))}},
		{name: "monitor stale: the holder stopped refreshing (its gauges are gone)",
			replicas: withBilling(
				replica{target: o("a"), slot: orders.slot, role: "streaming", set: map[string]string{
					"cdcrelay_monitor_holder": "1x40", "cdcrelay_monitor_last_success_timestamp_seconds": "60x40"}},
				replica{target: o("b"), slot: orders.slot, role: "standby"}),
			quietAt: []string{"5m"},
			fire:    []firing{fire("15m", "CdcrelayMonitorStale", v.bySlot("CdcrelayMonitorStale", orders))}},
		{name: "monitor lock moves to the standby: the newest refresh counts",
			replicas: withBilling(
				replica{target: o("a"), slot: orders.slot, role: "streaming", holder: true, set: map[string]string{
					"cdcrelay_monitor_holder": "1x9 0x31", "cdcrelay_monitor_last_success_timestamp_seconds": "0+60x9 540x31"}},
				replica{target: o("b"), slot: orders.slot, role: "standby", set: map[string]string{
					"cdcrelay_monitor_holder": "0x9 1x31", "cdcrelay_monitor_last_success_timestamp_seconds": "0x9 600+60x30"}}),
			quietAt: []string{"20m", "30m", "40m"}},
		{name: "janitor keeps failing: fires within 5 minutes",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_marks_failing_seconds": "0+60x40"})...),
			quietAt:  []string{"3m"},
			fire:     []firing{fire("5m", "CdcrelayMarkingFailing", v.bySlot("CdcrelayMarkingFailing", orders))}},
		{name: "janitor fails for two minutes, then writes again",
			replicas: withBilling(ordersWith(o, map[string]string{"cdcrelay_marks_failing_seconds": "0x4 0+60x3 0x33"})...),
			quietAt:  []string{"6m", "8m", "20m"}},
		{name: "retention fails for hours after a success: fires three hours after it, once it lasts 15m",
			replicas: retentionWith(o, billingHealthy(b), map[string]string{
				"cdcrelay_retention_runs_total":                     "0x30 1x270",
				"cdcrelay_retention_last_success_timestamp_seconds": "0x30 1800x270",
				"cdcrelay_retention_errors_total":                   "0x90 0+1x210"}),
			quietAt: []string{"60m", "200m", "220m"},
			fire: []firing{
				fire("230m", "CdcrelayRetentionFailing", v.bySlot("CdcrelayRetentionFailing", orders)),
				fire("290m", "CdcrelayRetentionFailing", v.bySlot("CdcrelayRetentionFailing", orders)),
			}},
		{name: "retention fails from the start (a missing DELETE grant): fires once it lasts 15m",
			replicas: retentionWith(o, billingHealthy(b), map[string]string{"cdcrelay_retention_errors_total": "0+1x300"}),
			quietAt:  []string{"10m"},
			fire:     []firing{fire("20m", "CdcrelayRetentionFailing", v.bySlot("CdcrelayRetentionFailing", orders))}},
		{name: "retention fails once, then runs hourly: quiet",
			replicas: retentionWith(o, billingHealthy(b), map[string]string{
				"cdcrelay_retention_errors_total":                   "0x60 1x240",
				"cdcrelay_retention_runs_total":                     "0x65 1x60 2x60 3x60 4x55",
				"cdcrelay_retention_last_success_timestamp_seconds": "0x65 3900x60 7500x60 11100x60 14700x55"}),
			quietAt: []string{"63m", "70m", "120m", "200m", "290m"}},
		{name: "retention runs no more after a success, no error, while the pod streams: fires three hours after it",
			replicas: retentionWith(o, billingHealthy(b), map[string]string{
				"cdcrelay_retention_runs_total":                     "0x10 1x290",
				"cdcrelay_retention_last_success_timestamp_seconds": "0x10 600x290"}),
			quietAt: []string{"30m", "190m"},
			fire:    []firing{fire("210m", "CdcrelayRetentionFailing", v.bySlot("CdcrelayRetentionFailing", orders))}},
		{name: "a standby's old success and a streaming pod that runs hourly: the newest success counts",
			replicas: func() []replica {
				rs := retentionWith(o, billingHealthy(b), map[string]string{
					"cdcrelay_retention_runs_total":                     "0x20 1x60 2x60 3x60 4x60 5x40",
					"cdcrelay_retention_last_success_timestamp_seconds": "0x20 1200x60 4800x60 8400x60 12000x60 15600x40"})
				rs[1].set = map[string]string{"cdcrelay_retention_runs_total": "5x300", "cdcrelay_retention_last_success_timestamp_seconds": "60x300"}
				return rs
			}(),
			quietAt: []string{"10m", "200m", "290m"}},
		{name: "end-to-end latency above the threshold",
			replicas: withBilling(ordersWith(o, map[string]string{
				`cdcrelay_commit_to_ack_seconds_bucket{le="0.1"}`: "0x40", `cdcrelay_commit_to_ack_seconds_bucket{le="1"}`: "0x40"})...),
			quietAt: []string{"5m"},
			fire:    []firing{fire("15m", "CdcrelayEndToEndSlow", v.bySlot("CdcrelayEndToEndSlow", orders))}},
		{name: "annotations of the stall and dead-letter alerts as rendered",
			replicas: withBilling(ordersWith(o, map[string]string{
				noRoute.series(): "1x40", `cdcrelay_dead_letter_failures_total{outcome="returned"}`: "0x4 2x36"})...),
			fire: []firing{
				fire("6m", "CdcrelayUnroutableStall", with(v.bySlot("CdcrelayUnroutableStall", orders), noRoute.labels())),
				fire("6m", "CdcrelayDeadLetterFailed", with(v.bySlot("CdcrelayDeadLetterFailed", orders), map[string]string{"outcome": "returned"})),
			},
			fullAnnotations: map[string]map[string]string{
				"CdcrelayUnroutableStall": {
					"summary":     "The stream of svc/rel-cdcrelay-orders is stalled on outbox row 0190a4c2-7d1e-7b4a-9f00-3c1d2e4f5a6b: the broker cannot route it",
					"description": `Outbox row 0190a4c2-7d1e-7b4a-9f00-3c1d2e4f5a6b (routing key "orders.refunded", exchange "events") cannot be routed: no queue is bound for its routing key (cause no_route). With unroutable: stall the relay publishes it again and again and nothing committed after it, so commit order holds, until a queue is bound for the key (or the exchange is declared); the slot's WAL and the backlog grow meanwhile, and nothing is lost. Bind the queue that should get it, or park the row: ` + runbookBase + "#a-row-the-broker-cannot-route",
					"runbook_url": runbookBase + "#cdcrelayunroutablestall",
				},
				"CdcrelayDeadLetterFailed": {
					"summary":     "The broker did not take dead-letter copies of parked rows of svc/rel-cdcrelay-orders (returned)",
					"description": "The relay parked outbox rows and sent a copy of each to the dead-letter exchange, and the broker did not take 2 of them within 15 minutes: returned, no queue is bound on the dead-letter exchange for the row's routing key. The rows are parked all the same (published_at NULL, last_error set) and the stream goes on, so no event is lost, but whoever watches the dead-letter queue does not hear of them. Bind a queue that takes every key to the dead-letter exchange: " + runbookBase + "#a-dead-letter-copy-the-broker-did-not-take",
					"runbook_url": runbookBase + "#cdcrelaydeadletterfailed",
				},
			}},
		{name: "the stall's description names a missing exchange",
			replicas: withBilling(ordersWith(o, map[string]string{noExchange.series(): "1x40"})...),
			fire:     []firing{fire("5m", "CdcrelayUnroutableStall", with(v.bySlot("CdcrelayUnroutableStall", orders), noExchange.labels()))},
			fullAnnotations: map[string]map[string]string{
				"CdcrelayUnroutableStall": {
					"summary":     "The stream of svc/rel-cdcrelay-orders is stalled on outbox row 1042: the broker cannot route it",
					"description": `Outbox row 1042 (routing key "invoice.issued", exchange "billing.v2") cannot be routed: the exchange named in its exchange column does not exist (cause no_exchange). With unroutable: stall the relay publishes it again and again and nothing committed after it, so commit order holds, until a queue is bound for the key (or the exchange is declared); the slot's WAL and the backlog grow meanwhile, and nothing is lost. Bind the queue that should get it, or park the row: ` + runbookBase + "#a-row-the-broker-cannot-route",
					"runbook_url": runbookBase + "#cdcrelayunroutablestall",
				},
			}},
		{name: "annotations as rendered",
			replicas: []replica{{target: b("c"), slot: billing.slot, role: "streaming", holder: true, set: map[string]string{
				"cdcrelay_slot_retained_wal_bytes": gib2, "cdcrelay_oldest_unpublished_age_seconds": "600x40"}}},
			fire: []firing{
				fire("15m", "CdcrelayNoStreamingRelay", v.perSource("CdcrelayNoStreamingRelay", orders)),
				fire("15m", "CdcrelaySlotRetainedWalHigh", v.bySlot("CdcrelaySlotRetainedWalHigh", billing)),
				fire("15m", "CdcrelayOldestUnpublishedTooOld", v.bySlot("CdcrelayOldestUnpublishedTooOld", billing)),
			},
			fullAnnotations: map[string]map[string]string{
				"CdcrelayNoStreamingRelay": {
					"summary":     "No relay streams slot cdcrelay_orders (svc/rel-cdcrelay-orders)",
					"description": "No scraped replica of svc/rel-cdcrelay-orders reports role=streaming: the pods are down, not scraped, still starting, or all waiting as standbys (an adoption or slot recreation that publishes its backlog does not count while the backfill advances, nor a stream stalled on an unroutable row, which CdcrelayUnroutableStall reports). Outbox events are not published, and none is lost: they wait in the outbox, and PostgreSQL keeps the WAL for slot cdcrelay_orders meanwhile.",
					"runbook_url": runbookBase + "#cdcrelaynostreamingrelay",
				},
				"CdcrelaySlotRetainedWalHigh": {
					"summary":     "Slot cdcrelay_billing holds back 2GiB of WAL",
					"description": "The replication slot cdcrelay_billing (svc/rel-cdcrelay-billing) is not advancing fast enough: PostgreSQL keeps its WAL and the primary's disk fills up (no event is lost). Check that a relay streams, that the broker confirms publishes and that nothing else holds the slot back.",
					"runbook_url": runbookBase + "#cdcrelayslotretainedwalhigh",
				},
				"CdcrelayOldestUnpublishedTooOld": {
					"summary":     "The oldest unmarked outbox row of slot cdcrelay_billing is 10m 0s old",
					"description": "An outbox row of svc/rel-cdcrelay-billing (parked rows aside) still has published_at NULL after this long. Either it was not published (no relay streams, the broker refuses or blocks, the slot does not advance) or it was published and not marked (the janitor fails). No event is lost: the row waits in the outbox. Check the other alerts of this service first.",
					"runbook_url": runbookBase + "#cdcrelayoldestunpublishedtooold",
				},
			}},
	}
}

func selectorScenarios(v ruleVariant) []ruleScenario {
	c := customTarget
	return []ruleScenario{
		{name: "custom selector: per-source rules find series without namespace and service",
			replicas: append(ordersHealthy(c), billingHealthy(c)),
			quietAt:  []string{"10m", "30m"}},
		{name: "custom selector: a streaming replica outside the selector does not count",
			replicas: append(ordersHealthy(c), billingHealthy(svcTarget(billing))),
			quietAt:  []string{"3m"},
			fire:     []firing{fire("10m", "CdcrelayNoStreamingRelay", v.perSource("CdcrelayNoStreamingRelay", billing))}},
		{name: "custom selector: orders streams without a standby",
			replicas: []replica{{target: c("a"), slot: orders.slot, role: "streaming", holder: true}, billingHealthy(c)},
			fire:     []firing{fire("20m", "CdcrelayNoStandby", v.perSource("CdcrelayNoStandby", orders))}},
		{name: "custom selector: retained WAL above the threshold",
			replicas: append(ordersWith(c, map[string]string{"cdcrelay_slot_retained_wal_bytes": "2147483648x40"}), billingHealthy(c)),
			fire:     []firing{fire("15m", "CdcrelaySlotRetainedWalHigh", v.bySlot("CdcrelaySlotRetainedWalHigh", orders))}},
		{name: "custom selector: a stall, labelled with its row",
			replicas: append(ordersWith(c, map[string]string{noRoute.series(): "1x40"}), billingHealthy(c)),
			fire:     []firing{fire("10m", "CdcrelayUnroutableStall", with(v.bySlot("CdcrelayUnroutableStall", orders), noRoute.labels()))}},
		{name: "custom selector: a stall of billing does not hide an outage of orders (joined by target)",
			replicas: []replica{
				{target: c("a"), slot: orders.slot, role: "starting", holder: true},
				{target: c("b"), slot: orders.slot, role: "starting"},
				{target: c("c"), slot: billing.slot, role: "streaming", holder: true, set: map[string]string{noExchange.series(): "1x40"}}},
			fire: []firing{
				fire("10m", "CdcrelayNoStreamingRelay", v.perSource("CdcrelayNoStreamingRelay", orders)),
				fire("10m", "CdcrelayUnroutableStall", with(v.bySlot("CdcrelayUnroutableStall", billing), noExchange.labels())),
			}},
		{name: "custom selector: a stall of orders holds NoStreamingRelay off for orders",
			replicas: []replica{
				{target: c("a"), slot: orders.slot, role: "starting", holder: true, set: map[string]string{noRoute.series(): "1x40"}},
				{target: c("b"), slot: orders.slot, role: "standby"},
				billingHealthy(c)},
			fire: []firing{fire("10m", "CdcrelayUnroutableStall", with(v.bySlot("CdcrelayUnroutableStall", orders), noRoute.labels()))}},
		{name: "custom selector: retention fails from the start, the alert names slot and source",
			replicas: append(ordersWith(c, map[string]string{"cdcrelay_retention_errors_total": "0+1x40"}), billingHealthy(c)),
			fire:     []firing{fire("20m", "CdcrelayRetentionFailing", v.bySlot("CdcrelayRetentionFailing", orders))}},
		{name: "custom selector: a foreign holder of the orders slot",
			replicas: append(ordersWith(c, map[string]string{`cdcrelay_status{reason="slot_foreign"}`: "1x40"}), billingHealthy(c)),
			fire:     []firing{fire("5m", "CdcrelaySlotForeignHolder", v.bySlot("CdcrelaySlotForeignHolder", orders))}},
		{name: "custom selector: parked row",
			replicas: append(ordersWith(c, map[string]string{"cdcrelay_outbox_parked": "1x40"}), billingHealthy(c)),
			fire:     []firing{fire("10m", "CdcrelayParkedRows", v.bySlot("CdcrelayParkedRows", orders))}},
	}
}

func defaultScenarios(v ruleVariant) []ruleScenario {
	t := svcTarget(single)
	return []ruleScenario{
		{name: "chart defaults: healthy",
			replicas: []replica{
				{target: t("a"), slot: single.slot, role: "streaming", holder: true},
				{target: t("b"), slot: single.slot, role: "standby"}},
			quietAt: []string{"10m", "30m"}},
		{name: "chart defaults: total outage fires NoStreamingRelay once and NoStandby not at all",
			fire: []firing{
				fire("10m", "CdcrelayNoStreamingRelay", v.perSource("CdcrelayNoStreamingRelay", single)),
				fire("30m", "CdcrelayNoStreamingRelay", v.perSource("CdcrelayNoStreamingRelay", single)),
			}},
		{name: "chart defaults: no standby",
			replicas: []replica{{target: t("a"), slot: single.slot, role: "streaming", holder: true}},
			fire:     []firing{fire("20m", "CdcrelayNoStandby", v.perSource("CdcrelayNoStandby", single))}},
	}
}

func ruleVariants() []ruleVariant {
	platform := map[string]string{"team": "platform"}
	vs := []ruleVariant{
		{name: "alerts.yaml", files: []string{"alerts.yaml"}, extra: platform},
		{name: "custom selector", files: []string{"alerts-selector.yaml"}, extra: platform, custom: true},
		{name: "chart defaults", files: []string{"single.yaml"}, set: []string{"--set", "monitoring.prometheusRule.enabled=true"}},
	}
	vs[0].scenarios = mainScenarios(vs[0])
	vs[1].scenarios = selectorScenarios(vs[1])
	vs[2].scenarios = defaultScenarios(vs[2])
	return vs
}

// TestAlertRulesWithPromtool evaluates the rendered alerts over the scenarios with
// `promtool test rules`, and checks that every alert has a scenario where it fires.
func TestAlertRulesWithPromtool(t *testing.T) {
	t.Parallel()
	promtoolBin(t)
	fired := map[string]bool{}
	var all []string
	for _, v := range ruleVariants() {
		groups := ruleGroups(t, v.files, v.set...)
		checkRules(t, groups)
		names := alertNames(groups)
		for _, n := range names {
			if !slices.Contains(all, n) {
				all = append(all, n)
			}
		}
		for _, s := range v.scenarios {
			for _, f := range s.fire {
				if len(f.labels) > 0 {
					fired[f.alert] = true
				}
				// promtool compares label sets exactly: these are the alerts' labels.
				for _, l := range f.labels {
					if l["slot"] == "" || l["source"] == "" {
						t.Errorf("%s/%s: %s expected with labels %v, without its slot or source", v.name, s.name, f.alert, l)
					}
				}
			}
			t.Run(v.name+"/"+s.name, func(t *testing.T) {
				t.Parallel()
				g := runbookOnly(groups)
				if s.fullAnnotations != nil {
					g = groups
				}
				promtoolTest(t, g, s.testGroupFor(names))
			})
		}
	}
	for _, n := range all {
		if !fired[n] {
			t.Errorf("%s: no scenario where it fires", n)
		}
	}
	if len(all) != len(defaultSeverity) {
		t.Errorf("alerts %v, want the %d of the contract", all, len(defaultSeverity))
	}
}
