package relay_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// scrape reads /metrics and returns each sample's value by name and labels
// (name{k="v",...}); histograms are reported by their _count.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, mf := range families {
		for _, m := range mf.GetMetric() {
			key := name + labels(m)
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[name+"_count"+labels(m)] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

func labels(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+`="`+l.GetValue()+`"`)
	}
	if len(parts) == 0 {
		return ""
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// TestIntegrationMetricsUnderLoad scrapes the binary's /metrics while
// events flow and checks that the counters move and the gauges make sense.
func TestIntegrationMetricsUnderLoad(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	addr := freeAddr(t)
	e.startProcess(map[string]string{"HTTP_ADDR": addr, "MONITOR_INTERVAL": "200ms"})
	waitReady(t, addr, "streaming", 30*time.Second)
	if code, body := get(t, addr, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d %s", code, body)
	}
	first, _ := insertTxns(t, e.db, "m", 100, 100)
	waitAll(t, e.consumer, first, 30*time.Second)
	before := scrapeSettled(t, addr, len(first))

	stop := make(chan struct{})
	during := keepInserting(t, e, "m", stop)
	time.Sleep(2 * time.Second)
	mid := scrape(t, addr)
	close(stop)
	rows := <-during
	waitAll(t, e.consumer, rows, 30*time.Second)
	after := scrapeSettled(t, addr, len(first)+len(rows))

	slot := `{slot="` + slotName + `"}`
	for _, name := range []string{
		"cdcrelay_events_decoded_total", "cdcrelay_events_published_total", "cdcrelay_published_bytes_total",
		"cdcrelay_transactions_decoded_total", "cdcrelay_confirmed_lsn", "cdcrelay_janitor_marked_total",
		"cdcrelay_confirm_latency_seconds_count", "cdcrelay_commit_to_ack_seconds_count" + slot,
		"cdcrelay_last_event_timestamp_seconds", "cdcrelay_last_confirm_timestamp_seconds",
	} {
		if !(before[name] < mid[name] && mid[name] <= after[name]) {
			t.Errorf("%s did not move under load: %v, %v, %v", name, before[name], mid[name], after[name])
		}
	}
	if got := after["cdcrelay_events_published_total"]; got < float64(len(first)+len(rows)) {
		t.Errorf("published %v, want at least %d", got, len(first)+len(rows))
	}
	checks := map[string]func(float64) bool{
		`cdcrelay_role{role="streaming",slot="` + slotName + `"}`:             func(v float64) bool { return v == 1 },
		`cdcrelay_role{role="standby",slot="` + slotName + `"}`:               func(v float64) bool { return v == 0 },
		`cdcrelay_status{reason="ok",slot="` + slotName + `"}`:                func(v float64) bool { return v == 1 },
		`cdcrelay_status{reason="retrying",slot="` + slotName + `"}`:          func(v float64) bool { return v == 0 },
		`cdcrelay_slot_wal_status{slot="` + slotName + `",status="reserved"}`: func(v float64) bool { return v == 1 },
		"cdcrelay_slot_retained_wal_bytes" + slot:                             func(v float64) bool { return v > 0 },
		"cdcrelay_slot_safe_wal_size_bytes" + slot:                            func(v float64) bool { return v == -1 },
		"cdcrelay_outbox_unpublished" + slot:                                  func(v float64) bool { return v == 0 },
		"cdcrelay_oldest_unpublished_age_seconds" + slot:                      func(v float64) bool { return v == 0 },
		"cdcrelay_confirms_in_flight":                                         func(v float64) bool { return v == 0 },
		"cdcrelay_nacks_total" + slot:                                         func(v float64) bool { return v == 0 },
		"cdcrelay_returns_total":                                              func(v float64) bool { return v == 0 },
		"cdcrelay_pipeline_restarts_total" + slot:                             func(v float64) bool { return v == 0 },
		// The relay's defaults; no backlog was left to adopt.
		"cdcrelay_max_in_flight_events":         func(v float64) bool { return v == 1000 },
		"cdcrelay_max_in_flight_bytes":          func(v float64) bool { return v == 16<<20 },
		"cdcrelay_backfill_running" + slot:      func(v float64) bool { return v == 0 },
		"cdcrelay_slot_lock_held" + slot:        func(v float64) bool { return v == 1 },
		"cdcrelay_backfill_rows" + slot:         func(v float64) bool { return v == 0 },
		"cdcrelay_in_flight_bytes":              func(v float64) bool { return v == 0 },
		"cdcrelay_marks_failing_seconds" + slot: func(v float64) bool { return v == 0 },
		"cdcrelay_last_event_timestamp_seconds": func(v float64) bool {
			return time.Since(time.Unix(int64(v), 0)) < time.Minute
		},
	}
	for name, ok := range checks {
		v, present := after[name]
		if !present || !ok(v) {
			t.Errorf("%s = %v (present %v)", name, v, present)
		}
	}
}

// scrapeSettled scrapes addr once the janitor has marked at least marked
// rows and the monitor has refreshed since: the marks and the backlog
// gauges then reflect every delivered row.
func scrapeSettled(t *testing.T, addr string, marked int) map[string]float64 {
	t.Helper()
	pollUntil(t, 30*time.Second, fmt.Sprintf("%d rows marked", marked), func() bool {
		return scrape(t, addr)["cdcrelay_janitor_marked_total"] >= float64(marked)
	})
	since := float64(time.Now().UnixNano()) / 1e9
	var m map[string]float64
	pollUntil(t, 30*time.Second, "a monitor turn after the marks", func() bool {
		m = scrape(t, addr)
		return m[lastSuccess] >= since
	})
	return m
}

func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
