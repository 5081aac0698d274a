package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/sethvargo/go-envconfig"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

var update = flag.Bool("update", false, "rewrite docs/metrics.txt from the registry `cdcrelay run` builds")

// metricsFile is the authoritative list of the relay's metrics; the chart's
// dashboard and rule tests read it.
var metricsFile = filepath.Join("..", "..", "docs", "metrics.txt")

const regenerate = "go test ./cmd/cdcrelay -run TestMetricsList -update"

// TestMetricsList: docs/metrics.txt lists exactly the metrics `cdcrelay
// run` registers, one `name type help` line each, sorted by name.
func TestMetricsList(t *testing.T) {
	got := strings.Join(registeredMetrics(t), "\n") + "\n"
	if *update {
		if err := os.WriteFile(metricsFile, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", metricsFile)
		return
	}
	want, err := os.ReadFile(metricsFile)
	if err != nil {
		t.Fatalf("%v; generate it with\n\t%s", err, regenerate)
	}
	if string(want) != got {
		t.Fatalf("docs/metrics.txt differs from the metrics `cdcrelay run` registers; regenerate it with\n\t%s\nand commit it.\n%s",
			regenerate, lineDiff(strings.Split(strings.TrimSuffix(string(want), "\n"), "\n"), strings.Split(strings.TrimSuffix(got, "\n"), "\n")))
	}
}

// TestMetricsListNamesTheContract: the metrics the contract between the
// relay, its alerts and its dashboard relies on are in the list.
func TestMetricsListNamesTheContract(t *testing.T) {
	have := map[string]string{}
	for _, l := range registeredMetrics(t) {
		f := strings.Fields(l)
		have[f[0]] = f[1]
	}
	for name, typ := range map[string]string{
		"cdcrelay_outbox_unpublished": "gauge", "cdcrelay_outbox_parked": "gauge",
		"cdcrelay_oldest_unpublished_age_seconds": "gauge", "cdcrelay_slot_retained_wal_bytes": "gauge",
		"cdcrelay_slot_lag_bytes": "gauge", "cdcrelay_slot_safe_wal_size_bytes": "gauge", "cdcrelay_slot_wal_status": "gauge",
		"cdcrelay_monitor_last_success_timestamp_seconds": "gauge", "cdcrelay_monitor_holder": "gauge",
		"cdcrelay_monitor_errors_total": "counter", "cdcrelay_role": "gauge", "cdcrelay_connect_failures_total": "counter",
		"cdcrelay_commit_to_ack_seconds": "histogram", "cdcrelay_poison_events_total": "counter",
		"cdcrelay_janitor_parked_total": "counter", "go_goroutines": "gauge", "process_resident_memory_bytes": "gauge",
	} {
		if have[name] != typ {
			t.Errorf("%s: type %q in the registry, want %q", name, have[name], typ)
		}
	}
}

// recorder is a Registerer that remembers every collector registered
// through it, so that their metrics can be listed before any is used.
type recorder struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// registeredMetrics builds the service as `run` does (nothing connects
// until it runs) and lists every metric its registry can export, vectors
// without a label value yet and the monitor's hidden gauges included:
// names and help come from the collectors' Descs, not from a scrape.
func registeredMetrics(t *testing.T) []string {
	t.Helper()
	cfg, err := config.LoadFrom(context.Background(), envconfig.MapLookuper(map[string]string{
		config.Prefix + "DATABASE_URL": "postgres://cdcrelay@127.0.0.1:1/app",
		config.Prefix + "AMQP_URL":     "amqp://guest:guest@127.0.0.1:1/",
		config.Prefix + "EXCHANGE":     "events",
	}))
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{Registry: prometheus.NewPedanticRegistry()}
	if _, err := newService(cfg, slog.New(slog.DiscardHandler), rec); err != nil {
		t.Fatal(err)
	}
	lines := map[string]string{}
	for _, c := range rec.collectors {
		types := collectorTypes(c)
		for _, d := range describe(c) {
			name, help := descNameHelp(t, d)
			typ, ok := types[name]
			if !ok {
				t.Fatalf("cannot tell the type of %s (collector %T)", name, c)
			}
			line := name + " " + typ + " " + strings.Join(strings.Fields(help), " ")
			if prev, dup := lines[name]; dup && prev != line {
				t.Fatalf("%s registered twice, differently:\n%s\n%s", name, prev, line)
			}
			lines[name] = line
		}
	}
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

func describe(c prometheus.Collector) []*prometheus.Desc {
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	var out []*prometheus.Desc
	for d := range ch {
		out = append(out, d)
	}
	return out
}

// collectorTypes returns the type of each metric c can export, by name:
// from its Go type for the client library's vectors, from ValueTypes for
// collectors that hide metrics (the monitor's), from what it collects now
// for the others.
func collectorTypes(c prometheus.Collector) map[string]string {
	out := map[string]string{}
	all := func(typ string) map[string]string {
		for _, d := range describe(c) {
			out[descName(d)] = typ
		}
		return out
	}
	switch v := c.(type) {
	case *prometheus.CounterVec:
		return all("counter")
	case *prometheus.GaugeVec:
		return all("gauge")
	case *prometheus.HistogramVec:
		return all("histogram")
	case *prometheus.SummaryVec:
		return all("summary")
	case interface {
		ValueTypes() map[string]prometheus.ValueType
	}:
		for name, vt := range v.ValueTypes() {
			out[name] = strings.ToLower(vt.ToDTO().String())
		}
		return out
	}
	ch := make(chan prometheus.Metric)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			continue // no type to learn from it
		}
		typ := "untyped"
		switch {
		case pb.Counter != nil:
			typ = "counter"
		case pb.Gauge != nil:
			typ = "gauge"
		case pb.Histogram != nil:
			typ = "histogram"
		case pb.Summary != nil:
			typ = "summary"
		}
		out[descName(m.Desc())] = typ
	}
	return out
}

// descRE reads the name and help out of Desc.String, the only way the
// client library shows them.
var descRE = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*")`)

func descNameHelp(t *testing.T, d *prometheus.Desc) (name, help string) {
	t.Helper()
	m := descRE.FindStringSubmatch(d.String())
	if m == nil {
		t.Fatalf("unexpected Desc format: %s", d)
	}
	name, err1 := strconv.Unquote(m[1])
	help, err2 := strconv.Unquote(m[2])
	if err1 != nil || err2 != nil {
		t.Fatalf("unexpected Desc format: %s", d)
	}
	return name, help
}

func descName(d *prometheus.Desc) string {
	if m := descRE.FindStringSubmatch(d.String()); m != nil {
		if name, err := strconv.Unquote(m[1]); err == nil {
			return name
		}
	}
	return ""
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got []string) string {
	in := func(s []string) map[string]bool {
		m := map[string]bool{}
		for _, l := range s {
			m[l] = true
		}
		return m
	}
	w, g := in(want), in(got)
	var b strings.Builder
	for _, l := range want {
		if !g[l] {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, l := range got {
		if !w[l] {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	return b.String()
}
