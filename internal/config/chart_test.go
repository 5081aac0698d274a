package config_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
		{"duration", "MARK_INTERVAL", durationValues},
		{"duration", "CONFIRM_TIMEOUT", durationValues},
		{"nonNegativeDuration", "AMQP_HEARTBEAT", map[string]bool{
			"10s": true, "0": true, "0s": true, "1.5h": true, "250µs": true, ".5s": true,
			"-1s": false, "10": false, "1d": false, "10 s": false, "": false,
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

// durationValues are the cases for a positive Go duration.
var durationValues = map[string]bool{
	"100ms": true, "15s": true, "1m30s": true, "1.5h": true, "250us": true, "250µs": true, "2h45m10s": true, "1.5s": true, "10ns": true, "0.5s": true,
	"0s": false, "0": false, "0.0h": false, "0h0m": false, "100": false, "1d": false, "15 s": false, "-1s": false, "1x": false, "": false,
}

// node is the part of a JSON schema the property test evaluates: enough for
// the chart's numeric, duration and size values.
type node struct {
	Ref     string   `json:"$ref"`
	Type    any      `json:"type"`
	Pattern string   `json:"pattern"`
	Minimum *float64 `json:"minimum"`
	Maximum *float64 `json:"maximum"`
	Not     *node    `json:"not"`
	AnyOf   []*node  `json:"anyOf"`
}

// accepts evaluates n for a string or int value, as Helm's validator would.
func (n *node) accepts(t *testing.T, defs map[string]*node, v any) bool {
	t.Helper()
	if n.Ref != "" {
		d, ok := defs[strings.TrimPrefix(n.Ref, "#/$defs/")]
		if !ok {
			t.Fatalf("no definition %s", n.Ref)
		}
		if !d.accepts(t, defs, v) {
			return false
		}
	}
	kind := "string"
	if _, ok := v.(int); ok {
		kind = "integer"
	}
	switch ty := n.Type.(type) {
	case string:
		if ty != kind {
			return false
		}
	case []any:
		if !slices.Contains(ty, any(kind)) {
			return false
		}
	}
	if s, ok := v.(string); ok && n.Pattern != "" && !regexp.MustCompile(n.Pattern).MatchString(s) {
		return false
	}
	if i, ok := v.(int); ok && ((n.Minimum != nil && float64(i) < *n.Minimum) || (n.Maximum != nil && float64(i) > *n.Maximum)) {
		return false
	}
	if n.Not != nil && n.Not.accepts(t, defs, v) {
		return false
	}
	if len(n.AnyOf) > 0 && !slices.ContainsFunc(n.AnyOf, func(a *node) bool { return a.accepts(t, defs, v) }) {
		return false
	}
	return true
}

// snake turns a chart value name into the relay's variable: maxInFlightBytes
// is MAX_IN_FLIGHT_BYTES.
func snake(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}

// TestChartSchemaPropertiesMirrorTheRelay: every number, duration and size a
// chart value sets (in defaults and on a source) is refused by the schema
// exactly when the relay refuses it: zero, negative, below or above a bound.
func TestChartSchemaPropertiesMirrorTheRelay(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Defs map[string]*node `json:"$defs"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	var props struct {
		Defs map[string]struct {
			Properties map[string]*node `json:"properties"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(b, &props); err != nil {
		t.Fatal(err)
	}
	sizes := []any{"0", "0B", "100B", "1023", "1023B", "1024", "1KiB", "512KiB", "16MiB", "1GiB", 0, 1, 1023, 1024, 16777216, -1}
	var durations []any
	for v := range durationValues {
		if v != "" {
			durations = append(durations, v)
		}
	}
	durations = append(durations, "0.5d", "7d", "1d12h", "-7d", "0d")
	// other holds a partner variable, so a cross-variable rule does not decide.
	other := map[string]map[string]string{
		"BACKOFF_MIN": {"BACKOFF_MAX": "1000h"},
		"BACKOFF_MAX": {"BACKOFF_MIN": "1ns"},
	}
	relay := relayNames()
	checked := 0
	for _, where := range []string{"defaults", "source"} {
		for prop, n := range props.Defs[where].Properties {
			key := snake(prop)
			if !slices.Contains(relay, key) {
				continue
			}
			var values []any
			switch {
			case n.Ref == "#/$defs/byteSize":
				values = sizes
			case strings.HasSuffix(n.Ref, "Duration") || n.Ref == "#/$defs/duration":
				values = durations
			case n.Minimum != nil || n.Maximum != nil:
				for _, m := range []*float64{n.Minimum, n.Maximum} {
					if m != nil {
						values = append(values, int(*m)-1, int(*m), int(*m)+1)
					}
				}
				values = append(values, 0, -1)
			default:
				continue
			}
			checked++
			for _, v := range values {
				s := fmt.Sprint(v)
				env := map[string]string{config.Prefix + "DATABASE_URL": "postgres://u@db/app", config.Prefix + key: s}
				for k, o := range other[key] {
					env[config.Prefix+k] = o
				}
				_, err := config.LoadFrom(context.Background(), envconfig.MapLookuper(env))
				var ce *config.Error
				if err != nil && !errors.As(err, &ce) {
					t.Fatalf("%s=%q: %v", key, s, err)
				}
				if got, want := n.accepts(t, schema.Defs, v), err == nil; got != want {
					t.Errorf("schema %s.%s accepts %#v: %v, but the relay %s%s=%s: %v (%v)", where, prop, v, got, config.Prefix, key, s, want, err)
				}
			}
		}
	}
	// confirmTimeout, statusInterval, shutdownTimeout, backoffMin, backoffMax,
	// amqpHeartbeat, markInterval, monitorInterval, retention, retentionInterval,
	// maxInFlight, maxInFlightBytes, publishChannels, markBatch, retentionBatch,
	// maxMessageBytes: in defaults and on a source.
	if checked < 32 {
		t.Errorf("only %d chart values compared with the relay", checked)
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
		"poison":       {config.PoisonPark, config.PoisonStop, nil},
		"slotLost":     {config.SlotLostRecreate, config.SlotLostStop, nil},
		"slotFailover": {config.SlotFailoverAuto, config.SlotFailoverOn, config.SlotFailoverOff, nil},
		"markOrigin":   {config.MarkOriginAuto, config.MarkOriginOff, nil},
	}
	for _, where := range []string{"defaults", "source"} {
		for key, w := range want {
			if got := schema.Defs[where].Properties[key].Enum; !reflect.DeepEqual(got, w) {
				t.Errorf("schema %s.%s: enum %v, want %v", where, key, got, w)
			}
		}
	}
}

// TestChartSchemaKnowsTheRelayVariables: the schema's list of CDCRELAY_ names an
// extraEnv entry may use (so `helm lint` refuses a typo) is the relay's list,
// in the order of _helpers.tpl's, which TestChartKnowsTheRelayVariables checks.
func TestChartSchemaKnowsTheRelayVariables(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Defs struct {
			EnvVar struct {
				Properties struct {
					Name struct {
						AnyOf []struct {
							Enum []string `json:"enum"`
						} `json:"anyOf"`
					} `json:"name"`
				} `json:"properties"`
			} `json:"envVar"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	var enum []string
	for _, a := range schema.Defs.EnvVar.Properties.Name.AnyOf {
		enum = append(enum, a.Enum...)
	}
	var want []string
	for _, n := range chartNames(t) {
		want = append(want, config.Prefix+n)
	}
	if !slices.Equal(enum, want) {
		t.Errorf("values.schema.json $defs/envVar name enum:\n%v\nwant (cdcrelay.relayVariables):\n%v", enum, want)
	}
	for _, n := range relayNames() {
		if !slices.Contains(enum, config.Prefix+n) {
			t.Errorf("the relay reads %s%s but the schema's extraEnv enum lacks it", config.Prefix, n)
		}
	}
}
