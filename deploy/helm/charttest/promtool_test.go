package charttest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// promtoolBin returns promtool: $PROMTOOL, or promtool on PATH. A missing binary
// fails the test: the rule tests are the only proof that the alerts fire, so they never skip.
func promtoolBin(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("PROMTOOL"); bin != "" {
		return bin
	}
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (%v): install Debian's prometheus package "+
			"(`apt-get install prometheus`, which provides /usr/bin/promtool) or set PROMTOOL", err)
	}
	return bin
}

// runPromtool runs promtool with args in dir and returns its combined output.
func runPromtool(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(promtoolBin(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// ruleFile is a Prometheus rule file: the PrometheusRule's spec.groups as they are.
type ruleFile struct {
	Groups []RuleGroup `json:"groups"`
}

// writeRuleFile writes groups as rules.yaml in dir.
func writeRuleFile(t *testing.T, dir string, groups []RuleGroup) {
	t.Helper()
	b, err := yaml.Marshal(ruleFile{Groups: groups})
	if err != nil {
		t.Fatalf("marshal rules: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// checkRules runs `promtool check rules` over groups: valid PromQL, durations,
// label names and annotation templates.
func checkRules(t *testing.T, groups []RuleGroup) {
	t.Helper()
	dir := t.TempDir()
	writeRuleFile(t, dir, groups)
	out, err := runPromtool(t, dir, "check", "rules", "rules.yaml")
	if err != nil || !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// The promtool unit test file format (promtool test rules).
type (
	inputSeries struct {
		Series string `json:"series"`
		Values string `json:"values"`
	}
	expAlert struct {
		ExpLabels      map[string]string `json:"exp_labels,omitempty"`
		ExpAnnotations map[string]string `json:"exp_annotations,omitempty"`
	}
	alertTestCase struct {
		EvalTime  string     `json:"eval_time"`
		Alertname string     `json:"alertname"`
		ExpAlerts []expAlert `json:"exp_alerts"`
	}
	testGroup struct {
		Interval      string          `json:"interval"`
		InputSeries   []inputSeries   `json:"input_series"`
		AlertRuleTest []alertTestCase `json:"alert_rule_test"`
	}
	unitTestFile struct {
		RuleFiles          []string    `json:"rule_files"`
		EvaluationInterval string      `json:"evaluation_interval"`
		Tests              []testGroup `json:"tests"`
	}
)

// promtoolTest runs one promtool unit test group against groups.
func promtoolTest(t *testing.T, groups []RuleGroup, tg testGroup) {
	t.Helper()
	dir := t.TempDir()
	writeRuleFile(t, dir, groups)
	b, err := yaml.Marshal(unitTestFile{RuleFiles: []string{"rules.yaml"}, EvaluationInterval: "1m", Tests: []testGroup{tg}})
	if err != nil {
		t.Fatalf("marshal test: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runPromtool(t, dir, "test", "rules", "test.yaml")
	if err != nil || !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules: %v\n%s\ntest file:\n%s", err, out, b)
	}
}

// TestPromtoolCatchesAWrongExpectation shows that promtoolTest fails when an
// expected alert does not fire, so a passing rule test means something.
func TestPromtoolCatchesAWrongExpectation(t *testing.T) {
	t.Parallel()
	groups := []RuleGroup{{Name: "g", Rules: []Rule{{Alert: "A", Expr: "foo > 1", For: "0m"}}}}
	dir := t.TempDir()
	writeRuleFile(t, dir, groups)
	tg := testGroup{
		Interval:    "1m",
		InputSeries: []inputSeries{{Series: `foo{a="b"}`, Values: "0x10"}},
		AlertRuleTest: []alertTestCase{{EvalTime: "5m", Alertname: "A",
			ExpAlerts: []expAlert{{ExpLabels: map[string]string{"a": "b"}}}}},
	}
	b, err := yaml.Marshal(unitTestFile{RuleFiles: []string{"rules.yaml"}, EvaluationInterval: "1m", Tests: []testGroup{tg}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runPromtool(t, dir, "test", "rules", "test.yaml")
	if err == nil || !strings.Contains(out, "FAILED") {
		t.Fatalf("promtool passed a test whose alert cannot fire: %v\n%s", err, out)
	}
}
