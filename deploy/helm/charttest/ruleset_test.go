package charttest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// TestAlertRuleSet checks the rendered alert set against the contract: the alert
// names and default severities, one per-source rule for every source that runs
// (none for a paused one), annotations and runbook links on every rule, no absent()
// outside the per-source NoStreamingRelay, and PromQL that parses and selects
// only metrics the relay exports, scoped by the selector.
func TestAlertRuleSet(t *testing.T) {
	t.Parallel()
	known := knownMetrics(t)
	for _, tc := range []struct {
		file   string
		scoped func(s selector) bool
	}{
		{"alerts.yaml", func(s selector) bool {
			ns, svc := s.matcher("namespace"), s.matcher("service")
			return ns != nil && ns.Type == labels.MatchEqual && ns.Value == namespace && svc != nil &&
				(svc.Matches(orders.service) || svc.Matches(billing.service)) && !svc.Matches("other-service")
		}},
		{"alerts-selector.yaml", func(s selector) bool {
			job := s.matcher("job")
			return job != nil && job.Type == labels.MatchEqual && job.Value == "cdcrelay" && s.matcher("namespace") == nil && s.matcher("service") == nil
		}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			groups := ruleGroups(t, []string{tc.file})
			perSource := map[string][]string{}
			for _, g := range groups {
				for _, r := range g.Rules {
					sev, ok := defaultSeverity[r.Alert]
					if !ok {
						t.Errorf("unexpected alert %s", r.Alert)
					}
					if r.Labels["severity"] != sev || r.Labels["team"] != "platform" {
						t.Errorf("%s: labels %v, want severity %s and alertLabels", r.Alert, r.Labels, sev)
					}
					if r.Annotations["summary"] == "" || r.Annotations["description"] == "" ||
						r.Annotations["runbook_url"] != runbookBase+"#"+strings.ToLower(r.Alert) {
						t.Errorf("%s: annotations %v", r.Alert, r.Annotations)
					}
					if !promDuration.MatchString(r.For) || r.For == "" {
						t.Errorf("%s: for %q", r.Alert, r.For)
					}
					if strings.Contains(r.Expr, "absent") != (r.Alert == "CdcrelayNoStreamingRelay") {
						t.Errorf("%s: absent() only belongs to the per-source NoStreamingRelay: %s", r.Alert, r.Expr)
					}
					sels := parsePromQL(t, r.Alert, r.Expr)
					checkNames(t, known, r.Alert, r.Expr, sels)
					for _, s := range sels {
						if !tc.scoped(s) {
							t.Errorf("%s: selector %s%v is not scoped by the release's selector", r.Alert, s.name, s.matchers)
						}
					}
					if r.Alert == "CdcrelayNoStreamingRelay" || r.Alert == "CdcrelayNoStandby" {
						perSource[r.Alert] = append(perSource[r.Alert], r.Labels["source"])
						for _, s := range sels {
							if s.name == "cdcrelay_stalled_event_info" {
								// No slot label: joined by target with the slot's own role series.
								if !strings.Contains(r.Expr, fmt.Sprintf(`and on (job, instance) cdcrelay_role{%s,slot=%q})`, strings.Join(matcherStrings(s), ","), r.Labels["slot"])) {
									t.Errorf("%s for %s: the stall is not joined with the slot's replicas: %s", r.Alert, r.Labels["source"], r.Expr)
								}
								continue
							}
							if m := s.matcher("slot"); m == nil || m.Value != r.Labels["slot"] {
								t.Errorf("%s for %s: selector without its slot: %s", r.Alert, r.Labels["source"], r.Expr)
							}
						}
					}
				}
			}
			// legacy is paused (replicas: 0) and billing has one replica.
			if got := perSource["CdcrelayNoStreamingRelay"]; !slices.Equal(got, []string{"orders", "billing"}) {
				t.Errorf("CdcrelayNoStreamingRelay rules for sources %v, want orders and billing", got)
			}
			if got := perSource["CdcrelayNoStandby"]; !slices.Equal(got, []string{"orders"}) {
				t.Errorf("CdcrelayNoStandby rules for sources %v, want orders only", got)
			}
		})
	}
}

// matcherStrings returns a selector's matchers as PromQL writes them.
func matcherStrings(s selector) []string {
	var out []string
	for _, m := range s.matchers {
		out = append(out, m.String())
	}
	return out
}

// TestAlertGroupingMatchesLabels: every alert names its slot and source. A
// per-source rule has both as static labels. Every other rule aggregates by
// namespace, service, source and slot in each aggregation (none aggregates them
// away), over metrics that carry the relay's slot label (slotLabelled, as the relay
// registers them: a `by (slot)` over a metric without it would promise a label the
// alert never carries), and its `source` label is the chart's template that names
// the source of the alert's slot, for targets a custom selector finds without one.
func TestAlertGroupingMatchesLabels(t *testing.T) {
	t.Parallel()
	want := []string{"namespace", "service", "source", "slot"}
	sources := []source{orders, billing}
	for _, file := range []string{"alerts.yaml", "alerts-selector.yaml"} {
		groups := ruleGroups(t, []string{file})
		checked, aggregated := 0, 0
		for _, g := range groups {
			for _, r := range g.Rules {
				if r.Alert == "CdcrelayNoStreamingRelay" || r.Alert == "CdcrelayNoStandby" {
					if r.Labels["slot"] == "" || r.Labels["source"] == "" || strings.Contains(r.Labels["source"]+r.Labels["slot"], "{{") {
						t.Errorf("%s (%s): per-source rule with labels %v, want a static slot and source", r.Alert, file, r.Labels)
					}
					continue
				}
				aggregated++
				for _, s := range sources {
					if !strings.Contains(r.Labels["source"], fmt.Sprintf(`{{ if eq $labels.slot %q }}%s{{ else }}`, s.slot, s.name)) {
						t.Errorf("%s (%s): source label %q does not name %s for slot %s", r.Alert, file, r.Labels["source"], s.name, s.slot)
					}
				}
				if r.Labels["slot"] != "" {
					t.Errorf("%s (%s): static slot %q: the slot is the series'", r.Alert, file, r.Labels["slot"])
				}
				e, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
				if err != nil {
					t.Fatalf("%s: %v", r.Alert, err)
				}
				aggs := 0
				parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
					agg, ok := n.(*parser.AggregateExpr)
					if !ok {
						return nil
					}
					checked++
					aggs++
					for _, l := range want {
						if agg.Without || !slices.Contains(agg.Grouping, l) {
							t.Errorf("%s (%s): %s aggregates %s away", r.Alert, file, agg.String(), l)
						}
					}
					sels, err := selectors(agg.Expr.String())
					if err != nil {
						t.Fatalf("%s: %v", r.Alert, err)
					}
					for _, s := range sels {
						if name := strings.TrimSuffix(s.name, "_bucket"); !slotLabelled[name] {
							t.Errorf("%s (%s): %s groups by slot over %s, which has no slot label", r.Alert, file, agg.String(), s.name)
						}
					}
					return nil
				})
				if aggs == 0 {
					t.Errorf("%s (%s): no aggregation: one alert per replica, not per source: %s", r.Alert, file, r.Expr)
				}
			}
		}
		if checked < 20 || aggregated != len(defaultSeverity)-2 {
			t.Errorf("%s: only %d aggregations in %d aggregated rules checked", file, checked, aggregated)
		}
	}
}

// ruleByAlert returns the rules of an alert.
func ruleByAlert(groups []RuleGroup, alert string) []Rule {
	var out []Rule
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Alert == alert {
				out = append(out, r)
			}
		}
	}
	return out
}

// TestAlertRuleValues checks that every value key reaches the rules: thresholds
// (fractions and large integers printed as PromQL numbers), for, severity, enabled,
// runbookBaseURL, and extraRules appended after the chart's rules.
func TestAlertRuleValues(t *testing.T) {
	t.Parallel()
	groups := ruleGroups(t, []string{"alerts.yaml"},
		"--set-json", "monitoring.prometheusRule.endToEndSlow.threshold=0.25",
		"--set", "monitoring.prometheusRule.slotNearInvalidation.threshold=5368709120",
		"--set", "monitoring.prometheusRule.oldestUnpublished.threshold=900",
		"--set", "monitoring.prometheusRule.restartStorm.threshold=10",
		"--set", "monitoring.prometheusRule.monitorStale.threshold=600",
		"--set", "monitoring.prometheusRule.retentionFailing.threshold=7200",
		"--set", "monitoring.prometheusRule.noStreamingRelay.for=2m",
		"--set", "monitoring.prometheusRule.noStandby.severity=info",
		"--set", "monitoring.prometheusRule.brokerBlocked.enabled=false",
		"--set", "monitoring.prometheusRule.unroutableStall.for=30s",
		"--set", "monitoring.prometheusRule.unroutableStall.severity=page",
		"--set", "monitoring.prometheusRule.deadLetterFailed.enabled=false",
		"--set", "monitoring.prometheusRule.foreignInsertsSkipped.enabled=false",
		"--set", "monitoring.prometheusRule.runbookBaseURL=https://wiki.example.org/cdcrelay",
		"--set-json", `monitoring.prometheusRule.extraRules=[{"alert":"MyOwnAlert","expr":"vector(1)","for":"1m","labels":{"severity":"info"}}]`)
	checkRules(t, groups)
	wantSuffix := map[string]string{
		"CdcrelayEndToEndSlow":            "> 0.25",
		"CdcrelaySlotNearInvalidation":    ">= 0 < 5368709120",
		"CdcrelayOldestUnpublishedTooOld": "> 900",
		"CdcrelayRestartStorm":            "> 10 unless on (namespace, service, source, slot) max_over_time(cdcrelay_stalled_event_info{" + `namespace="svc",service=~"rel-cdcrelay-orders|rel-cdcrelay-billing|rel-cdcrelay-legacy"}[15m])`,
		"CdcrelayMonitorStale":            "> 600",
		"CdcrelayRetentionFailing":        `> 7200 and on (namespace, service, source, slot) max by (namespace, service, source, slot) (cdcrelay_role{namespace="svc",service=~"rel-cdcrelay-orders|rel-cdcrelay-billing|rel-cdcrelay-legacy",role="streaming"}) == 1)`,
	}
	for alert, suffix := range wantSuffix {
		rs := ruleByAlert(groups, alert)
		if len(rs) != 1 || !strings.HasSuffix(rs[0].Expr, suffix) {
			t.Errorf("%s: %+v, want one rule ending in %q", alert, rs, suffix)
		}
	}
	for _, r := range ruleByAlert(groups, "CdcrelayNoStreamingRelay") {
		if r.For != "2m" {
			t.Errorf("CdcrelayNoStreamingRelay for %s: for %q, want 2m", r.Labels["source"], r.For)
		}
	}
	for _, r := range ruleByAlert(groups, "CdcrelayNoStandby") {
		if r.Labels["severity"] != "info" {
			t.Errorf("CdcrelayNoStandby: severity %q, want info", r.Labels["severity"])
		}
	}
	if rs := ruleByAlert(groups, "CdcrelayBrokerBlocked"); len(rs) != 0 {
		t.Errorf("CdcrelayBrokerBlocked rendered though disabled")
	}
	if rs := ruleByAlert(groups, "CdcrelayDeadLetterFailed"); len(rs) != 0 {
		t.Errorf("CdcrelayDeadLetterFailed rendered though disabled")
	}
	if rs := ruleByAlert(groups, "CdcrelayForeignInsertsSkipped"); len(rs) != 0 {
		t.Errorf("CdcrelayForeignInsertsSkipped rendered though disabled")
	}
	if rs := ruleByAlert(groups, "CdcrelayUnroutableStall"); len(rs) != 1 || rs[0].For != "30s" || rs[0].Labels["severity"] != "page" ||
		!strings.Contains(rs[0].Annotations["description"], "https://wiki.example.org/cdcrelay#a-row-the-broker-cannot-route") {
		t.Errorf("CdcrelayUnroutableStall: %+v, want for 30s, severity page and the runbook base in its description", rs)
	}
	if r := ruleByAlert(groups, "CdcrelaySlotLost"); len(r) != 1 || r[0].Annotations["runbook_url"] != "https://wiki.example.org/cdcrelay#cdcrelayslotlost" {
		t.Errorf("runbookBaseURL not applied: %+v", r)
	}
	rules := groups[len(groups)-1].Rules
	if last := rules[len(rules)-1]; last.Alert != "MyOwnAlert" || last.Expr != "vector(1)" {
		t.Errorf("extraRules not appended: last rule %+v", last)
	}
}

// TestAlertValuesSchema checks that the schema rejects misspelt alert keys, a
// selector with braces and a duration Prometheus does not accept.
func TestAlertValuesSchema(t *testing.T) {
	t.Parallel()
	for name, set := range map[string]string{
		"misspelt key":     "monitoring.prometheusRule.noStandby.treshold=1",
		"unknown alert":    "monitoring.prometheusRule.noSuchAlert.enabled=true",
		"braces":           `monitoring.prometheusRule.selector={job="x"}`,
		"bad duration":     "monitoring.prometheusRule.nacks.for=5 minutes",
		"zero threshold":   "monitoring.prometheusRule.slotRetainedWal.threshold=0",
		"dashboard typo":   "monitoring.grafanaDashboard.enable=true",
		"runbook fragment": "monitoring.prometheusRule.runbookBaseURL=https://x/y#z",
	} {
		args := templateArgs(chartDir, []string{"alerts.yaml"}, "--set", set)
		if _, stderr, err := runHelm(t, args...); err == nil || !exitError(err) || !strings.Contains(stderr, "schema") {
			t.Errorf("%s (%s): rendered or failed for another reason: %v\n%s", name, set, err, stderr)
		}
	}
}

// TestRemovedReturnsKey: the key of the former CdcrelayMessagesReturned fails the
// render with a message that names its successor, instead of being ignored.
func TestRemovedReturnsKey(t *testing.T) {
	t.Parallel()
	args := templateArgs(chartDir, []string{"alerts.yaml"}, "--set", "monitoring.prometheusRule.returns.enabled=false")
	_, stderr, err := runHelm(t, args...)
	if err == nil || !exitError(err) || !strings.Contains(stderr, "monitoring.prometheusRule.returns is gone") ||
		!strings.Contains(stderr, "monitoring.prometheusRule.unroutableStall") {
		t.Errorf("returns.enabled=false: want a failure naming unroutableStall (err %v):\n%s", err, stderr)
	}
}

// TestPromtoolChecksEveryVariant runs `promtool check rules` over the rules of every
// value set the tests render with alerts on.
func TestPromtoolChecksEveryVariant(t *testing.T) {
	t.Parallel()
	on := []string{"--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.prometheusRule.endToEndSlow.enabled=true"}
	for _, files := range [][]string{{"monitoring.yaml"}, {"multi.yaml"}, {"single.yaml"}, {"files.yaml"}, {"quoted.yaml"}, {"alerts.yaml"}, {"alerts-selector.yaml"}} {
		t.Run(files[0], func(t *testing.T) {
			t.Parallel()
			groups := ruleGroups(t, files, on...)
			if n := len(alertNames(groups)); n != len(defaultSeverity) {
				t.Errorf("%d alerts rendered, want %d", n, len(defaultSeverity))
			}
			checkRules(t, groups)
		})
	}
}

// TestAlertSelectorTrimmed: a custom selector written with stray commas or
// spaces at its ends renders rules that parse and are scoped as the clean
// one's; left as written, `job="cdcrelay",` would put an empty matcher
// (",,") before the rules' own matchers.
func TestAlertSelectorTrimmed(t *testing.T) {
	t.Parallel()
	for _, sel := range []string{`job="cdcrelay",`, ` , job="cdcrelay" , `} {
		t.Run(sel, func(t *testing.T) {
			t.Parallel()
			// helm's --set splits on commas unless escaped.
			groups := ruleGroups(t, []string{"alerts-selector.yaml"}, "--set-string", "monitoring.prometheusRule.selector="+strings.ReplaceAll(sel, ",", `\,`))
			rules := 0
			for _, g := range groups {
				for _, r := range g.Rules {
					rules++
					for _, s := range parsePromQL(t, r.Alert, r.Expr) {
						if job := s.matcher("job"); job == nil || job.Value != "cdcrelay" || s.matcher("namespace") != nil {
							t.Errorf("%s: selector %s%v is not the custom one", r.Alert, s.name, s.matchers)
						}
					}
				}
			}
			if rules == 0 {
				t.Fatal("no rule rendered")
			}
		})
	}
}
