package charttest

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// repoRoot is the repository root, relative to this package.
var repoRoot = filepath.Join("..", "..", "..")

// selector is one vector selector of a parsed expression.
type selector struct {
	name     string
	matchers []*labels.Matcher
}

// matcher returns the selector's matcher on label name, or nil.
func (s selector) matcher(name string) *labels.Matcher {
	for _, m := range s.matchers {
		if m.Name == name {
			return m
		}
	}
	return nil
}

// parsePromQL parses expr with Prometheus' own PromQL parser and returns its vector
// selectors, failing the test if it does not parse.
func parsePromQL(t *testing.T, where, expr string) []selector {
	t.Helper()
	sels, err := selectors(expr)
	if err != nil {
		t.Errorf("%s: %q does not parse: %v", where, expr, err)
	}
	return sels
}

// selectors parses expr and returns its vector selectors (those inside range
// selectors and function calls included).
func selectors(expr string) ([]selector, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var out []selector
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		s := selector{name: vs.Name}
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				if m.Type == labels.MatchEqual {
					s.name = m.Value
				}
				continue
			}
			s.matchers = append(s.matchers, m)
		}
		out = append(out, s)
		return nil
	})
	return out, nil
}

// knownMetrics reads docs/metrics.txt (`name type help`, one metric a line, as
// generated from the relay's registry) into the series names each metric exposes:
// a histogram's _bucket, _sum and _count, a summary's _sum and _count besides its name.
func knownMetrics(t *testing.T) map[string]string {
	t.Helper()
	path := filepath.Join(repoRoot, "docs", "metrics.txt")
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("metrics list: %v", err)
	}
	defer f.Close()
	known := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			t.Fatalf("%s: line %q is not `name type help`", path, line)
		}
		name, typ := fields[0], fields[1]
		known[name] = typ
		switch typ {
		case "histogram":
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				known[name+suf] = typ
			}
		case "summary":
			for _, suf := range []string{"_sum", "_count"} {
				known[name+suf] = typ
			}
		case "counter", "gauge", "untyped":
		default:
			t.Fatalf("%s: %s has unknown type %q", path, name, typ)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(known) < 20 || known["cdcrelay_role"] != "gauge" {
		t.Fatalf("%s lists %d metrics and cdcrelay_role as %q: not the relay's registry", path, len(known), known["cdcrelay_role"])
	}
	return known
}

// checkNames fails for every selector without a metric name or with one the relay does not export.
func checkNames(t *testing.T, known map[string]string, where, expr string, sels []selector) {
	t.Helper()
	for _, s := range sels {
		switch {
		case s.name == "":
			t.Errorf("%s: a selector without a metric name in %q", where, expr)
		case known[s.name] == "":
			t.Errorf("%s: metric %s is not in docs/metrics.txt (the relay's registry): %q", where, s.name, expr)
		}
	}
}

// grafanaVar matches Grafana's variables in a query: $__rate_interval, $service, ${service}, ${service:csv}.
var (
	grafanaRange = regexp.MustCompile(`\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}`)
	grafanaVar   = regexp.MustCompile(`\$\{[A-Za-z_][A-Za-z0-9_]*(:[a-z]+)?\}|\$[A-Za-z_][A-Za-z0-9_]*`)
	labelValues  = regexp.MustCompile(`^label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\)$`)
	queryResult  = regexp.MustCompile(`^query_result\((.*)\)$`)
)

// grafanaToPromQL replaces dashboard variables by values of the right kind, so that
// a panel's query parses as PromQL: durations for the interval variables, a
// plain value for the others (they appear inside label matcher strings).
func grafanaToPromQL(expr string) string {
	expr = grafanaRange.ReplaceAllString(expr, "5m")
	return grafanaVar.ReplaceAllString(expr, "value")
}

// variableQueryExpr returns the PromQL inside a Prometheus variable query
// (label_values(selector, label) or query_result(expr)); "" for label_values(label).
func variableQueryExpr(t *testing.T, q string) string {
	t.Helper()
	q = strings.TrimSpace(q)
	if m := labelValues.FindStringSubmatch(q); m != nil {
		return m[1]
	}
	if m := queryResult.FindStringSubmatch(q); m != nil {
		return m[1]
	}
	if regexp.MustCompile(`^label_values\(\s*[A-Za-z_][A-Za-z0-9_]*\s*\)$`).MatchString(q) {
		return ""
	}
	t.Errorf("variable query %q is neither label_values(...) nor query_result(...)", q)
	return ""
}

// TestParserChecksWhatItShould shows the helpers reject a broken expression and an
// unknown metric, so the checks below can fail.
func TestParserChecksWhatItShould(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{`sum(rate(foo[5m])`, `rate(foo[$__rate_interval])`, `foo{a="b",}}`, `max by (a) foo`} {
		if _, err := selectors(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	sels := parsePromQL(t, "x", `histogram_quantile(0.99, sum by (le) (rate(cdcrelay_commit_to_ack_seconds_bucket{a="b"}[5m]))) / on() group_left cdcrelay_nope`)
	var names []string
	for _, s := range sels {
		names = append(names, s.name)
	}
	if !slices.Equal(names, []string{"cdcrelay_commit_to_ack_seconds_bucket", "cdcrelay_nope"}) {
		t.Errorf("selectors %v", names)
	}
	if got := grafanaToPromQL(`rate(x{service=~"$service"}[$__rate_interval])`); got != `rate(x{service=~"value"}[5m])` {
		t.Errorf("grafanaToPromQL: %s", got)
	}
	if got := grafanaToPromQL(`label_replace(vector(0), "service", "${service:csv}", "", "") or x{a="${a}"}`); got != `label_replace(vector(0), "service", "value", "", "") or x{a="value"}` {
		t.Errorf("grafanaToPromQL: %s", got)
	}
}
