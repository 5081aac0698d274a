package charttest

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	grafana "github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// sdkDashboardFile is the dashboard the chart ships (the ConfigMap's data).
const sdkDashboardFile = "../cdcrelay/dashboards/cdcrelay.json"

// sdkParse decodes a dashboard with the Grafana foundation SDK's strict
// unmarshaler: an unknown field or a value of the wrong type anywhere in
// the dashboard, its panels, their options and field config (per panel type,
// once the SDK's panel plugins are registered) or their Prometheus queries
// is an error. No Grafana server can run here, so this is the closest to
// Grafana's own reading of the file.
func sdkParse(raw []byte) error {
	plugins.RegisterDefaultPlugins()
	// The v1 type, deprecated for v2's: the chart ships a classic JSON
	// model (schemaVersion 39), which is what v1 describes; v2 is another format.
	var d grafana.Dashboard //nolint:staticcheck // see above
	return d.UnmarshalJSONStrict(raw)
}

// sdkDefaulted are the fields the SDK's schema calls required but Grafana
// fills in when it loads a dashboard without them: a template variable's
// current selection, resolved from its query at load (the dashboard sets
// none, so that each user starts from what their Prometheus has). Only
// their absence is forgiven; a wrong type or an unknown field still fails.
var sdkDefaulted = []string{".current.text", ".current.value"}

const sdkMissing = "required field is missing from input"

// sdkFindings are the SDK's errors but the forgiven ones, and those.
func sdkFindings(err error) (fail, forgiven []string) {
	var errs cog.BuildErrors
	if !errors.As(err, &errs) {
		return []string{err.Error()}, nil
	}
outer:
	for _, e := range errs {
		if e.Message == sdkMissing {
			for _, f := range sdkDefaulted {
				if strings.HasSuffix(e.Path, f) {
					forgiven = append(forgiven, e.Path)
					continue outer
				}
			}
		}
		fail = append(fail, e.Error())
	}
	return fail, forgiven
}

func TestDashboardSDKStrict(t *testing.T) {
	raw, err := os.ReadFile(sdkDashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := sdkParse(raw); err != nil {
		fail, forgiven := sdkFindings(err)
		if len(forgiven) > 0 {
			t.Logf("left to Grafana's defaults (%d): %s", len(forgiven), strings.Join(forgiven, ", "))
		}
		if len(fail) > 0 {
			t.Fatalf("%s: the Grafana foundation SDK refuses it:\n%s", sdkDashboardFile, strings.Join(fail, "\n"))
		}
	}
}

// TestDashboardSDKStrictCatches proves the check above is real: copies of
// the dashboard with one field broken each fail to parse, naming the field.
func TestDashboardSDKStrictCatches(t *testing.T) {
	raw, err := os.ReadFile(sdkDashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, want string
		mutate     func(d map[string]any, panel map[string]any)
	}{
		{"gridPos.w as a string", "w", func(_, p map[string]any) { p["gridPos"].(map[string]any)["w"] = "12" }},
		{"unknown dashboard field", "refreshh", func(d, _ map[string]any) { d["refreshh"] = "30s" }},
		{"unknown panel field", "titel", func(_, p map[string]any) { p["titel"] = "x" }},
		{"unknown field in a panel's options", "legendd", func(_, p map[string]any) { p["options"].(map[string]any)["legendd"] = true }},
		{"unknown field in a Prometheus query", "exprr", func(_, p map[string]any) { p["targets"].([]any)[0].(map[string]any)["exprr"] = "up" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			var d map[string]any
			if err := json.Unmarshal(raw, &d); err != nil {
				t.Fatal(err)
			}
			c.mutate(d, firstPanel(t, d, "timeseries"))
			broken, err := json.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			err = sdkParse(broken)
			if err == nil {
				t.Fatalf("broken copy (%s) parses", c.name)
			}
			fail, _ := sdkFindings(err)
			if !strings.Contains(strings.Join(fail, "\n"), c.want) {
				t.Fatalf("broken copy (%s): unforgiven errors %q, want one naming %q", c.name, fail, c.want)
			}
		})
	}
}

// firstPanel is the first top-level panel of a type, with options and targets.
func firstPanel(t *testing.T, d map[string]any, typ string) map[string]any {
	t.Helper()
	for _, p := range d["panels"].([]any) {
		panel := p.(map[string]any)
		_, opts := panel["options"].(map[string]any)
		targets, _ := panel["targets"].([]any)
		if panel["type"] == typ && opts && len(targets) > 0 {
			return panel
		}
	}
	t.Fatalf("no top-level %s panel with options and targets", typ)
	return nil
}
