package config_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sethvargo/go-envconfig"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// The Helm chart (deploy/helm/cdcrelay) sets the relay's variables from its values
// and refuses extraEnv entries naming a CDCRELAY_ variable the relay does not
// read. These tests keep the chart's copy of what the relay reads in step with
// the relay itself.

var chartDir = filepath.Join("..", "..", "deploy", "helm", "cdcrelay")

// relayNames derives the variable names (without Prefix) from Config's env tags,
// as the relay's own loader does.
func relayNames() []string {
	t := reflect.TypeFor[config.Config]()
	var names []string
	for i := range t.NumField() {
		if tag, ok := t.Field(i).Tag.Lookup("env"); ok {
			names = append(names, strings.TrimSpace(strings.SplitN(tag, ",", 2)[0]))
		}
	}
	return names
}

// chartNames reads the chart's list: the "cdcrelay.relayVariables" template in
// _helpers.tpl, one name per line.
func chartNames(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)\{\{- define "cdcrelay.relayVariables" -\}\}\n(.*?)\n\{\{- end \}\}`).FindSubmatch(b)
	if m == nil {
		t.Fatal(`_helpers.tpl has no "cdcrelay.relayVariables" template`)
	}
	return strings.Split(string(m[1]), "\n")
}

func TestChartKnowsTheRelayVariables(t *testing.T) {
	relay, chart := relayNames(), chartNames(t)
	if len(relay) < 30 {
		t.Fatalf("only %d variables derived from Config: %v", len(relay), relay)
	}
	for _, n := range relay {
		if !slices.Contains(chart, n) {
			t.Errorf("the relay reads %s%s but the chart's list (cdcrelay.relayVariables in _helpers.tpl) lacks it: extraEnv would refuse it", config.Prefix, n)
		}
	}
	for _, n := range chart {
		if !slices.Contains(relay, n) {
			t.Errorf("the chart's list has %s%s, which the relay does not read", config.Prefix, n)
		}
	}
	seen := map[string]bool{}
	for _, n := range chart {
		if seen[n] {
			t.Errorf("the chart's list has %s twice", n)
		}
		seen[n] = true
	}
}

// schemaDef is the part of a values.schema.json $defs entry the tests read.
type schemaDef struct {
	Pattern string `json:"pattern"`
	Not     struct {
		Pattern string `json:"pattern"`
	} `json:"not"`
}

// schemaAccepts reports whether a string value passes a $defs entry's pattern
// and not-pattern, as Helm's schema validation (Go regexp) checks them.
func schemaAccepts(t *testing.T, d schemaDef, v string) bool {
	t.Helper()
	if d.Pattern == "" {
		t.Fatal("schema definition without a pattern")
	}
	if !regexp.MustCompile(d.Pattern).MatchString(v) {
		return false
	}
	return d.Not.Pattern == "" || !regexp.MustCompile(d.Not.Pattern).MatchString(v)
}

// relayAccepts reports whether the relay loads with Prefix+key set to v.
func relayAccepts(t *testing.T, key, v string) bool {
	t.Helper()
	env := envconfig.MapLookuper(map[string]string{config.Prefix + "DATABASE_URL": "postgres://u@db/app", config.Prefix + key: v})
	_, err := config.LoadFrom(context.Background(), env)
	var ce *config.Error
	if err != nil && !errors.As(err, &ce) {
		t.Fatalf("%s=%q: %v", key, v, err)
	}
	return err == nil
}

// TestChartSchemaMirrorsTheRelay: the chart's schema patterns for durations,
// day durations and sizes accept what the relay accepts and refuse what it
// refuses, so a bad value fails `helm install`, not the pod.
func TestChartSchemaMirrorsTheRelay(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Defs map[string]schemaDef `json:"$defs"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		def, key string // schema definition, a variable of that kind
		values   map[string]bool
	}{
		{"goDuration", "MARK_INTERVAL", map[string]bool{
			"100ms": true, "15s": true, "1m30s": true, "1.5h": true, "250us": true, "2h45m10s": true,
			"0s": false, "0": false, "100": false, "1d": false, "15 s": false, "-1s": false, "1x": false, "": false,
		}},
		{"dayDuration", "RETENTION", map[string]bool{
			"7d": true, "1d12h": true, "36h": true, "90m": true, "1d30m": true, "1.5h": true,
			"0d": false, "0s": false, "2w": false, "d": false, "7": false, "1h1d": false, "7 days": false, "-7d": false, "": false,
		}},
		{"byteSize", "MAX_MESSAGE_BYTES", map[string]bool{
			"16MiB": true, "512KiB": true, "1GiB": true, "1048576": true, "100B": true, "16 MiB": true,
			"0": false, "0MiB": false, "16MB": false, "16mib": false, "1.5MiB": false, "-1": false, "016MiB": false, "": false,
		}},
	}
	for _, c := range cases {
		d, ok := schema.Defs[c.def]
		if !ok {
			t.Fatalf("values.schema.json has no $defs/%s", c.def)
		}
		for v, want := range c.values {
			if got := schemaAccepts(t, d, v); got != want {
				t.Errorf("schema %s: %q accepted %v, want %v", c.def, v, got, want)
			}
			if v == "" {
				continue // an empty variable is unset for the relay; the chart renders none
			}
			if got := relayAccepts(t, c.key, v); got != want {
				t.Errorf("relay %s%s=%q accepted %v, want %v (the schema must follow the relay)", config.Prefix, c.key, v, got, want)
			}
		}
	}
}

// TestChartSchemaPolicyEnums: the chart offers exactly the relay's choices.
func TestChartSchemaPolicyEnums(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Defs map[string]struct {
			Properties map[string]struct {
				Enum []any `json:"enum"`
			} `json:"properties"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	want := map[string][]any{
		"poison":   {config.PoisonPark, config.PoisonStop, nil},
		"slotLost": {config.SlotLostRecreate, config.SlotLostStop, nil},
	}
	for _, where := range []string{"defaults", "source"} {
		for key, w := range want {
			if got := schema.Defs[where].Properties[key].Enum; !reflect.DeepEqual(got, w) {
				t.Errorf("schema %s.%s: enum %v, want %v", where, key, got, w)
			}
		}
	}
}
