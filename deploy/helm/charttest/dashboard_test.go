package charttest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

const dashboardFile = "../cdcrelay/dashboards/cdcrelay.json"

// The part of Grafana's dashboard model the tests read.
type (
	dashboard struct {
		UID           string       `json:"uid"`
		Title         string       `json:"title"`
		SchemaVersion int          `json:"schemaVersion"`
		Templating    templating   `json:"templating"`
		Panels        []panel      `json:"panels"`
		ID            *json.Number `json:"id"`
	}
	templating struct {
		List []variable `json:"list"`
	}
	variable struct {
		Name       string          `json:"name"`
		Type       string          `json:"type"`
		Query      json.RawMessage `json:"query"`
		Datasource *datasourceRef  `json:"datasource"`
		Multi      bool            `json:"multi"`
		IncludeAll bool            `json:"includeAll"`
	}
	datasourceRef struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
	gridPos struct{ H, W, X, Y int }
	panel   struct {
		ID         int            `json:"id"`
		Type       string         `json:"type"`
		Title      string         `json:"title"`
		GridPos    gridPos        `json:"gridPos"`
		Datasource *datasourceRef `json:"datasource"`
		Targets    []target       `json:"targets"`
		Panels     []panel        `json:"panels"`
	}
	target struct {
		Expr       string         `json:"expr"`
		RefID      string         `json:"refId"`
		Datasource *datasourceRef `json:"datasource"`
	}
)

func loadDashboard(t *testing.T) (dashboard, []byte) {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardFile, err)
	}
	return d, raw
}

// allPanels returns the panels, those nested in collapsed rows included.
func (d dashboard) allPanels() []panel {
	var out []panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// variableQuery returns a query variable's query string, in either of the forms
// Grafana stores (a string, or an object with a `query` field).
func variableQuery(t *testing.T, v variable) string {
	t.Helper()
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(v.Query, &o); err != nil {
		t.Fatalf("variable %s: query %s", v.Name, v.Query)
	}
	return o.Query
}

// dashboardExprs returns every PromQL query of the dashboard (variables replaced),
// keyed by where it is.
func dashboardExprs(t *testing.T, d dashboard) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		if e := variableQueryExpr(t, variableQuery(t, v)); e != "" {
			out["variable "+v.Name] = grafanaToPromQL(e)
		}
	}
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			out[fmt.Sprintf("panel %q target %s", p.Title, tg.RefID)] = grafanaToPromQL(tg.Expr)
		}
	}
	return out
}

// TestDashboard checks the dashboard is one Grafana imports and provisions as it is:
// valid JSON, no fixed id, a Prometheus data source variable that every query uses,
// unique panel ids, panels inside the 24-column grid, and queries on every panel.
func TestDashboard(t *testing.T) {
	t.Parallel()
	d, _ := loadDashboard(t)
	if d.UID == "" || d.Title == "" || d.ID != nil {
		t.Errorf("dashboard uid %q title %q id %v: want a uid and a title, and no id (Grafana assigns it)", d.UID, d.Title, d.ID)
	}
	if d.SchemaVersion < 36 || d.SchemaVersion > 41 {
		t.Errorf("schemaVersion %d, want one of Grafana 9 to 11 (about 39)", d.SchemaVersion)
	}
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if ds := vars["datasource"]; ds.Type != "datasource" || variableQuery(t, ds) != "prometheus" {
		t.Errorf("no datasource variable of type prometheus: %+v", ds)
	}
	for _, name := range []string{"namespace", "service"} {
		v, ok := vars[name]
		if !ok || v.Type != "query" || v.Datasource == nil || v.Datasource.UID != "${datasource}" {
			t.Errorf("variable %s: %+v, want a query on ${datasource}", name, v)
		}
	}
	ids := map[int]string{}
	for _, p := range d.allPanels() {
		if prev, dup := ids[p.ID]; dup || p.ID == 0 {
			t.Errorf("panel %q: id %d (also %q)", p.Title, p.ID, prev)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
		}
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || len(p.Targets) == 0 || p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q (%s): want a title, targets and the ${datasource} data source", p.Title, p.Type)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.RefID == "" || refs[tg.RefID] || tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: target %+v: want an expr, a unique refId and the ${datasource} data source", p.Title, tg)
			}
			refs[tg.RefID] = true
		}
	}
}

// TestDashboardQueries parses every query of the dashboard with the PromQL parser
// and checks that each selects metrics the relay exports, scoped to the namespace
// and service variables, and that the panels the operations docs promise exist.
func TestDashboardQueries(t *testing.T) {
	t.Parallel()
	known := knownMetrics(t)
	// Prometheus' own series of every target, beside the relay's.
	known["up"] = "gauge"
	d, _ := loadDashboard(t)
	used := map[string]bool{}
	var all []string
	for where, expr := range dashboardExprs(t, d) {
		all = append(all, expr)
		sels := parsePromQL(t, where, expr)
		checkNames(t, known, where, expr, sels)
		for _, s := range sels {
			used[s.name] = true
			if strings.HasPrefix(where, "variable ") {
				continue // the variables narrow one another: namespace, then service
			}
			ns, svc := s.matcher("namespace"), s.matcher("service")
			if ns == nil || svc == nil {
				t.Errorf("%s: %s is not scoped by namespace and service: %q", where, s.name, expr)
			}
		}
	}
	for _, m := range []string{
		"cdcrelay_events_published_total", "cdcrelay_events_decoded_total",
		"cdcrelay_commit_to_ack_seconds_bucket", "cdcrelay_confirm_latency_seconds_bucket", "cdcrelay_confirms_in_flight",
		"cdcrelay_slot_lag_bytes", "cdcrelay_slot_retained_wal_bytes", "cdcrelay_slot_safe_wal_size_bytes", "cdcrelay_slot_wal_status",
		"cdcrelay_outbox_unpublished", "cdcrelay_oldest_unpublished_age_seconds", "cdcrelay_outbox_parked", "cdcrelay_poison_events_total",
		"cdcrelay_pipeline_restarts_total", "cdcrelay_connect_failures_total", "cdcrelay_reconnects_total", "cdcrelay_broker_blocked",
		"cdcrelay_janitor_marked_total", "cdcrelay_janitor_errors_total", "cdcrelay_janitor_rows_gone_total",
		"cdcrelay_retention_runs_total", "cdcrelay_retention_errors_total", "cdcrelay_janitor_deleted_total",
		"cdcrelay_role", "cdcrelay_monitor_holder", "cdcrelay_monitor_last_success_timestamp_seconds",
		"process_resident_memory_bytes", "process_cpu_seconds_total",
		"up", "process_start_time_seconds", "cdcrelay_max_in_flight_events", "cdcrelay_max_in_flight_bytes",
		"cdcrelay_backfill_rows", "cdcrelay_backfill_rows_done", "cdcrelay_backfill_running", "cdcrelay_status",
	} {
		if !used[m] {
			t.Errorf("no dashboard query uses %s", m)
		}
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{
		"histogram_quantile(0.5, sum by (service, le) (rate(cdcrelay_commit_to_ack_seconds_bucket",
		"histogram_quantile(0.99, sum by (service, le) (rate(cdcrelay_commit_to_ack_seconds_bucket",
		"by (service, side) (increase(cdcrelay_connect_failures_total",
		"by (service, side) (increase(cdcrelay_reconnects_total",
		"by (service, pod) (cdcrelay_role",
		"max by (service, pod, reason) (cdcrelay_status{",
		// Restarts from the relay's own start time: kube-state-metrics is not assumed.
		"sum by (service, pod) (changes(process_start_time_seconds{",
		"max by (service, pod) (up{",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("no dashboard query contains %q", want)
		}
	}
}

// dashboardConfigMaps returns the rendered ConfigMaps labelled for Grafana's sidecar.
func dashboardConfigMaps(r *Rendered) []int {
	var idx []int
	for i, c := range r.ConfigMaps {
		if _, ok := c.Labels["grafana_dashboard"]; ok {
			idx = append(idx, i)
		}
	}
	return idx
}

func TestDashboardConfigMap(t *testing.T) {
	t.Parallel()
	_, raw := loadDashboard(t)
	if r := render(t, []string{"single.yaml"}); len(dashboardConfigMaps(r)) != 0 {
		t.Errorf("dashboard ConfigMap rendered though monitoring.grafanaDashboard is off by default")
	}

	r := render(t, []string{"multi.yaml"}, "--set", "monitoring.grafanaDashboard.enabled=true")
	checkRelease(t, r)
	idx := dashboardConfigMaps(r)
	if len(idx) != 1 {
		t.Fatalf("%d dashboard ConfigMaps, want 1 per release", len(idx))
	}
	c := r.ConfigMaps[idx[0]]
	checkMeta(t, "ConfigMap", c.ObjectMeta)
	if c.Labels["grafana_dashboard"] != "1" {
		t.Errorf("labels %v: want grafana_dashboard: \"1\"", c.Labels)
	}
	if got := c.Data["cdcrelay.json"]; strings.TrimSpace(got) != strings.TrimSpace(string(raw)) {
		t.Errorf("ConfigMap data cdcrelay.json differs from %s", dashboardFile)
	}
	if len(c.Data) != 1 || len(c.BinaryData) != 0 {
		t.Errorf("ConfigMap keys: want only cdcrelay.json")
	}

	r = render(t, []string{"single.yaml"},
		"--set", "monitoring.grafanaDashboard.enabled=true",
		"--set", "monitoring.grafanaDashboard.namespace=monitoring",
		"--set", "monitoring.grafanaDashboard.labels.team=platform",
		"--set", "monitoring.grafanaDashboard.annotations.grafana_folder=cdcrelay",
		"--set", "commonLabels.env=prod")
	idx = dashboardConfigMaps(r)
	if len(idx) != 1 {
		t.Fatalf("%d dashboard ConfigMaps, want 1", len(idx))
	}
	c = r.ConfigMaps[idx[0]]
	want := labels.Set{"grafana_dashboard": "1", "team": "platform", "env": "prod", "app.kubernetes.io/instance": releaseName}
	if c.Namespace != "monitoring" || !labels.SelectorFromSet(want).Matches(labels.Set(c.Labels)) || c.Annotations["grafana_folder"] != "cdcrelay" {
		t.Errorf("ConfigMap %s/%s labels %v annotations %v: want namespace monitoring, labels %v, grafana_folder cdcrelay",
			c.Namespace, c.Name, c.Labels, c.Annotations, want)
	}
}

// The part of a panel's field config the colour checks read.
type (
	valueMapping struct {
		Type    string `json:"type"`
		Options map[string]struct {
			Text  string `json:"text"`
			Color string `json:"color"`
		} `json:"options"`
	}
	panelConfig struct {
		ID          int `json:"id"`
		FieldConfig struct {
			Defaults struct {
				NoValue    string         `json:"noValue"`
				Mappings   []valueMapping `json:"mappings"`
				Thresholds struct {
					Steps []struct {
						Color string   `json:"color"`
						Value *float64 `json:"value"`
					} `json:"steps"`
				} `json:"thresholds"`
			} `json:"defaults"`
		} `json:"fieldConfig"`
		Options struct {
			ColorMode string `json:"colorMode"`
		} `json:"options"`
	}
)

// panelConfigs returns the field config of every panel, by id.
func panelConfigs(t *testing.T, raw []byte) map[int]panelConfig {
	t.Helper()
	var d struct {
		Panels []panelConfig `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	out := map[int]panelConfig{}
	for _, p := range d.Panels {
		out[p.ID] = p
	}
	return out
}

// mapped returns the text and colour a panel shows for value v: its value
// mapping's, else the colour of the threshold step v reaches.
func (p panelConfig) mapped(v float64) (text, color string) {
	for _, m := range p.FieldConfig.Defaults.Mappings {
		if o, ok := m.Options[strconv.FormatFloat(v, 'f', -1, 64)]; m.Type == "value" && ok {
			return o.Text, o.Color
		}
	}
	return "", p.threshold(v)
}

// threshold returns the colour of the threshold step v reaches.
func (p panelConfig) threshold(v float64) string {
	color := ""
	for _, s := range p.FieldConfig.Defaults.Thresholds.Steps {
		if s.Value == nil || v >= *s.Value {
			color = s.Color
		}
	}
	return color
}

// panelsUsing returns the panels with a target that selects metric.
func panelsUsing(t *testing.T, d dashboard, metric string) []panel {
	t.Helper()
	var out []panel
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			sels, err := selectors(grafanaToPromQL(tg.Expr))
			if err != nil {
				t.Fatalf("panel %q: %v", p.Title, err)
			}
			if slices.ContainsFunc(sels, func(s selector) bool { return s.name == metric }) {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// Dashboard queries evaluated by promtool over synthetic series (grafanaToPromQL
// makes every variable "value", so the series carry namespace and service "value").
type (
	expSample struct {
		Labels string  `json:"labels"`
		Value  float64 `json:"value"`
	}
	exprTest struct {
		Expr       string      `json:"expr"`
		EvalTime   string      `json:"eval_time"`
		ExpSamples []expSample `json:"exp_samples"`
	}
	exprTestGroup struct {
		Interval    string        `json:"interval"`
		InputSeries []inputSeries `json:"input_series"`
		Exprs       []exprTest    `json:"promql_expr_test"`
	}
	exprTestFile struct {
		RuleFiles          []string        `json:"rule_files"`
		EvaluationInterval string          `json:"evaluation_interval"`
		Tests              []exprTestGroup `json:"tests"`
	}
)

// promtoolExprTest runs `promtool test rules` with one group of expression tests.
func promtoolExprTest(t *testing.T, g exprTestGroup) {
	t.Helper()
	dir := t.TempDir()
	writeRuleFile(t, dir, nil)
	b, err := yaml.Marshal(exprTestFile{RuleFiles: []string{"rules.yaml"}, EvaluationInterval: "1m", Tests: []exprTestGroup{g}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runPromtool(t, dir, "test", "rules", "test.yaml")
	if err != nil || !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules: %v\n%s\ntest file:\n%s", err, out, b)
	}
}

const dashTarget = `namespace="value",service="value",pod="a",slot="s"`

// TestDashboardWalStatusColours: every panel on cdcrelay_slot_wal_status (the
// overview stat and the state timeline) shows each wal_status in its colour: lost
// red, unreserved orange, extended yellow, reserved green. promtool evaluates the
// panel's query with each status current, and the panel's value mapping (and, for
// the stat's background, its thresholds) turns the value into the status's name
// and colour.
func TestDashboardWalStatusColours(t *testing.T) {
	t.Parallel()
	promtoolBin(t)
	d, raw := loadDashboard(t)
	cfgs := panelConfigs(t, raw)
	want := map[string]string{"reserved": "green", "extended": "yellow", "unreserved": "orange", "lost": "red"}
	statuses := []string{"reserved", "extended", "unreserved", "lost"}
	panels := panelsUsing(t, d, "cdcrelay_slot_wal_status")
	types := map[string]bool{}
	for _, p := range panels {
		types[p.Type] = true
	}
	if !types["stat"] || !types["state-timeline"] {
		t.Fatalf("wal_status panels %v: want the overview stat and the state timeline", types)
	}
	// What the query gives for each status, learnt by evaluating it: status i is
	// current from step 10*i on.
	var series []inputSeries
	for i, st := range statuses {
		vals := make([]string, 0, 4)
		for j := range statuses {
			v := "0"
			if i == j {
				v = "1"
			}
			vals = append(vals, v+"x9")
		}
		series = append(series, inputSeries{Series: fmt.Sprintf(`cdcrelay_slot_wal_status{%s,status=%q}`, dashTarget, st), Values: strings.Join(vals, " ")})
	}
	codes := map[string]float64{}
	for _, p := range panels {
		if len(p.Targets) != 1 {
			t.Errorf("panel %q: %d targets, want the one wal_status query", p.Title, len(p.Targets))
			continue
		}
		cfg := cfgs[p.ID]
		g := exprTestGroup{Interval: "1m", InputSeries: series}
		for i, st := range statuses {
			var code float64
			for v := 0.0; v <= 10; v++ {
				if text, _ := cfg.mapped(v); text == st {
					code = v
				}
			}
			if code == 0 {
				t.Errorf("panel %q: no value maps to %q", p.Title, st)
				continue
			}
			if prev, ok := codes[st]; ok && prev != code {
				t.Errorf("panel %q: %s is %v here, %v in another panel", p.Title, st, code, prev)
			}
			codes[st] = code
			text, color := cfg.mapped(code)
			if text != st || color != want[st] {
				t.Errorf("panel %q: %s shows %q in %q, want %q", p.Title, st, text, color, want[st])
			}
			if p.Type == "stat" && cfg.threshold(code) != want[st] {
				t.Errorf("panel %q: the threshold colour of %s (%v) is %q, want %q", p.Title, st, code, cfg.threshold(code), want[st])
			}
			g.Exprs = append(g.Exprs, exprTest{Expr: grafanaToPromQL(p.Targets[0].Expr), EvalTime: fmt.Sprintf("%dm", 10*i+5),
				ExpSamples: []expSample{{Labels: `{service="value",slot="s"}`, Value: code}}})
		}
		if p.Type == "stat" && cfg.Options.ColorMode != "background" && cfg.Options.ColorMode != "value" {
			t.Errorf("panel %q: colorMode %q colours nothing", p.Title, cfg.Options.ColorMode)
		}
		promtoolExprTest(t, g)
	}
}

// TestDashboardStreamingReplicasZero: the overview's "Streaming replicas" shows 0,
// not "no data", when no replica streams: a service whose pods are scraped but none
// streams, one whose target is down, and a selection with no relay scraped at all
// (then labelled with the selected services); and no stray 0 beside a healthy count.
func TestDashboardStreamingReplicasZero(t *testing.T) {
	t.Parallel()
	promtoolBin(t)
	d, raw := loadDashboard(t)
	var p *panel
	for _, q := range d.allPanels() {
		if q.Title == "Streaming replicas" {
			p = &q
		}
	}
	if p == nil || len(p.Targets) != 1 {
		t.Fatalf("no Streaming replicas panel with one query: %+v", p)
	}
	if nv := panelConfigs(t, raw)[p.ID].FieldConfig.Defaults.NoValue; nv != "0" {
		t.Errorf("Streaming replicas: noValue %q, want \"0\"", nv)
	}
	expr := grafanaToPromQL(p.Targets[0].Expr)
	role := func(service, pod, role string) inputSeries {
		return inputSeries{Series: fmt.Sprintf(`cdcrelay_role{namespace="value",service=%q,pod=%q,slot="s",role=%q}`, service, pod, role), Values: "1x20"}
	}
	notRole := func(s inputSeries) inputSeries { s.Values = "0x20"; return s }
	up := func(service, pod, v string) inputSeries {
		return inputSeries{Series: fmt.Sprintf(`up{namespace="value",service=%q,pod=%q}`, service, pod), Values: v + "x20"}
	}
	for _, c := range []struct {
		name   string
		series []inputSeries
		want   []expSample
	}{
		{"no relay scraped at all", nil, []expSample{{Labels: `{service="value"}`, Value: 0}}},
		{"the target is down", []inputSeries{up("value", "a", "0")}, []expSample{{Labels: `{service="value"}`, Value: 0}}},
		{"scraped, every replica a standby",
			[]inputSeries{up("value", "a", "1"), role("value", "a", "standby"), notRole(role("value", "a", "streaming"))},
			[]expSample{{Labels: `{service="value"}`, Value: 0}}},
		{"one streams",
			[]inputSeries{up("value", "a", "1"), up("value", "b", "1"), role("value", "a", "streaming"), role("value", "b", "standby"), notRole(role("value", "b", "streaming"))},
			[]expSample{{Labels: `{service="value"}`, Value: 1}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			promtoolExprTest(t, exprTestGroup{Interval: "1m", InputSeries: c.series,
				Exprs: []exprTest{{Expr: expr, EvalTime: "10m", ExpSamples: c.want}}})
		})
	}
}

// TestDashboardOperatorPanels: the panels an on-call person looks for besides the
// relay's flow: whether Prometheus scrapes each pod (`up`), restarts of the relay
// process (from process_start_time_seconds: kube-state-metrics is not assumed), and
// the in-flight limits the relays run with, the events limit also beside the
// confirms in flight. The readiness reason (/readyz) is no metric, so no panel.
func TestDashboardOperatorPanels(t *testing.T) {
	t.Parallel()
	d, _ := loadDashboard(t)
	titles := func(ps []panel) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Title)
		}
		return out
	}
	if ps := panelsUsing(t, d, "up"); len(ps) == 0 || !slices.ContainsFunc(ps, func(p panel) bool { return p.Type == "state-timeline" }) {
		t.Errorf("panels on up %v: want a per-replica state timeline", titles(ps))
	}
	restarts := panelsUsing(t, d, "process_start_time_seconds")
	if len(restarts) != 1 || !strings.Contains(restarts[0].Targets[0].Expr, "changes(process_start_time_seconds{") {
		t.Errorf("panels on process_start_time_seconds %v: want one that counts its changes", titles(restarts))
	}
	events, bytes := panelsUsing(t, d, "cdcrelay_max_in_flight_events"), panelsUsing(t, d, "cdcrelay_max_in_flight_bytes")
	both := slices.ContainsFunc(events, func(p panel) bool {
		return slices.ContainsFunc(bytes, func(q panel) bool { return q.ID == p.ID })
	})
	beside := slices.ContainsFunc(events, func(p panel) bool { return len(panelsUsingIn(t, p, "cdcrelay_confirms_in_flight")) > 0 })
	if !both || !beside {
		t.Errorf("limit panels: events %v, bytes %v: want one panel with both limits, and the events limit beside confirms in flight", titles(events), titles(bytes))
	}
	// A backfill's ETA: what is left over the rate rows are confirmed at.
	eta := panelsUsing(t, d, "cdcrelay_backfill_rows_done")
	if len(eta) != 1 || !slices.ContainsFunc(eta[0].Targets, func(q target) bool {
		return strings.Contains(q.Expr, "max by (service, slot) (cdcrelay_backfill_rows{") && strings.Contains(q.Expr, "/ (max by (service, slot) (deriv(cdcrelay_backfill_rows_done{")
	}) {
		t.Errorf("panels on cdcrelay_backfill_rows_done %v: want one with the time left", titles(eta))
	}
}

// panelsUsingIn returns p if one of its targets selects metric.
func panelsUsingIn(t *testing.T, p panel, metric string) []panel {
	t.Helper()
	return panelsUsing(t, dashboard{Panels: []panel{p}}, metric)
}
