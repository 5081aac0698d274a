package charttest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
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

// TestRunbookAnchors checks that every alert's runbook_url points at a `## <AlertName>`
// heading of docs/runbook.md, by GitHub's anchor rule (lower case, spaces to hyphens,
// punctuation dropped).
func TestRunbookAnchors(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors, headings := map[string]bool{}, map[string]bool{}
	for _, line := range strings.Split(string(raw), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			h = strings.TrimSpace(h)
			headings[h] = true
			anchors[githubAnchor(h)] = true
		}
	}
	groups := ruleGroups(t, []string{"alerts.yaml"})
	names := alertNames(groups)
	if len(names) != len(defaultSeverity) {
		t.Fatalf("alerts.yaml renders alerts %v, want all %d", names, len(defaultSeverity))
	}
	for _, g := range groups {
		for _, r := range g.Rules {
			base, frag, ok := strings.Cut(r.Annotations["runbook_url"], "#")
			if !ok || base != runbookBase || !anchors[frag] {
				t.Errorf("%s: runbook_url %q: no such anchor in docs/runbook.md", r.Alert, r.Annotations["runbook_url"])
			}
			if !headings[r.Alert] {
				t.Errorf("%s: docs/runbook.md has no `## %s` heading", r.Alert, r.Alert)
			}
		}
	}
}

// githubAnchor is the id GitHub gives a Markdown heading.
func githubAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestGithubAnchor pins the anchor rule the runbook check relies on.
func TestGithubAnchor(t *testing.T) {
	t.Parallel()
	for h, want := range map[string]string{
		"CdcrelayNoStreamingRelay":               "cdcrelaynostreamingrelay",
		"PostgreSQL failover and major upgrade":  "postgresql-failover-and-major-upgrade",
		"Rolling back an adoption (and pausing)": "rolling-back-an-adoption-and-pausing",
	} {
		if got := githubAnchor(h); got != want {
			t.Errorf("githubAnchor(%q) = %q, want %q", h, got, want)
		}
	}
}
