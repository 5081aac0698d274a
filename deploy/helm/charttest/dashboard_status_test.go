package charttest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// statusReasons reads cdcrelay_status's reasons from its help text in
// docs/metrics.txt ("… 0 for the others: ok, connecting, …."), which the
// relay's registry generates: the dashboard must colour every one.
func statusReasons(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "metrics.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.HasPrefix(line, "cdcrelay_status gauge ") {
			continue
		}
		_, list, ok := strings.Cut(line, "0 for the others: ")
		if !ok {
			t.Fatalf("cdcrelay_status's help does not list its reasons: %q", line)
		}
		return strings.Split(strings.TrimSuffix(list, "."), ", ")
	}
	t.Fatal("docs/metrics.txt has no cdcrelay_status")
	return nil
}

// TestDashboardReadinessReason: the panel on cdcrelay_status shows one
// name per pod, "<pod>: <reason>", for the reason at 1 (promtool evaluates
// its query over two pods), and colours each reason: ok green, the ones
// that heal by themselves yellow, the ones that need an operator or keep
// the slot from advancing red.
func TestDashboardReadinessReason(t *testing.T) {
	t.Parallel()
	promtoolBin(t)
	d, raw := loadDashboard(t)
	panels := panelsUsing(t, d, "cdcrelay_status")
	if len(panels) != 1 || panels[0].Type != "stat" || len(panels[0].Targets) != 1 {
		t.Fatalf("%d panels on cdcrelay_status, want one stat with one query", len(panels))
	}
	p := panels[0]
	reasons := statusReasons(t)
	color := map[string]string{"ok": "green", "connecting": "yellow", "creating_slot": "yellow", "retrying": "yellow",
		"broker_blocked": "yellow", "needs_operator": "red", "marks_failing": "red", "marks_waiting": "red", "slot_foreign": "red"}
	if len(reasons) != len(color) {
		t.Fatalf("reasons %v: this test knows the colours of %d", reasons, len(color))
	}

	var series []inputSeries
	current := map[string]string{"a": "ok", "b": "needs_operator"}
	for pod, cur := range current {
		for _, r := range reasons {
			v := "0x5"
			if r == cur {
				v = "1x5"
			}
			series = append(series, inputSeries{Series: fmt.Sprintf(`cdcrelay_status{namespace="value",service="value",pod=%q,slot="s",reason=%q}`, pod, r), Values: v})
		}
	}
	promtoolExprTest(t, exprTestGroup{Interval: "1m", InputSeries: series, Exprs: []exprTest{{
		Expr: grafanaToPromQL(p.Targets[0].Expr), EvalTime: "3m",
		ExpSamples: []expSample{
			{Labels: `{service="value",pod="a",reason="ok"}`, Value: 1},
			{Labels: `{service="value",pod="b",reason="needs_operator"}`, Value: 1},
		}}}})

	var cfg struct {
		Panels []struct {
			ID          int `json:"id"`
			FieldConfig struct {
				Overrides []struct {
					Matcher struct {
						ID      string `json:"id"`
						Options string `json:"options"`
					} `json:"matcher"`
					Properties []struct {
						ID    string          `json:"id"`
						Value json.RawMessage `json:"value"` // a colour's is an object; other properties' differ
					} `json:"properties"`
				} `json:"overrides"`
			} `json:"fieldConfig"`
			Options struct {
				TextMode  string `json:"textMode"`
				ColorMode string `json:"colorMode"`
			} `json:"options"`
			Targets []struct {
				LegendFormat string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Panels {
		if c.ID != p.ID {
			continue
		}
		if c.Options.TextMode != "name" || c.Options.ColorMode != "background" || c.Targets[0].LegendFormat != "{{pod}}: {{reason}}" {
			t.Errorf("panel %q: textMode %q, colorMode %q, legend %q: want the name \"{{pod}}: {{reason}}\" on a coloured background",
				p.Title, c.Options.TextMode, c.Options.ColorMode, c.Targets[0].LegendFormat)
		}
		for _, r := range reasons {
			name := "pod-0: " + r
			got := ""
			for _, o := range c.FieldConfig.Overrides {
				if o.Matcher.ID != "byRegexp" || !regexp.MustCompile("^(?:"+o.Matcher.Options+")$").MatchString(name) {
					continue
				}
				for _, prop := range o.Properties {
					var c struct {
						FixedColor string `json:"fixedColor"`
					}
					if prop.ID == "color" && json.Unmarshal(prop.Value, &c) == nil {
						got = c.FixedColor // the last matching override wins, as in Grafana
					}
				}
			}
			if got != color[r] {
				t.Errorf("panel %q: %q shows %q, want %q", p.Title, name, got, color[r])
			}
		}
	}
}
