package monitor

import (
	"math"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// fakeClock is a settable clock for the freshness rule.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

// gaugeNames are the metrics exported only while fresh and held.
var gaugeNames = []string{
	"cdcrelay_oldest_unpublished_age_seconds", "cdcrelay_outbox_parked", "cdcrelay_outbox_unpublished",
	"cdcrelay_slot_lag_bytes", "cdcrelay_slot_retained_wal_bytes", "cdcrelay_slot_safe_wal_size_bytes",
	"cdcrelay_slot_wal_status", "cdcrelay_other_relay_slots",
}

// exported gathers reg and returns each series' value by name and labels.
// The key spells the labels as {slot=s1,status=lost}, braces even when
// there are none.
func exported(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	return testenv.Series(t, reg, func(m *dto.Metric) string {
		var ls []string
		for _, l := range m.GetLabel() {
			ls = append(ls, l.GetName()+"="+l.GetValue())
		}
		return "{" + strings.Join(ls, ",") + "}"
	})
}

func families(series map[string]float64) []string {
	seen := map[string]bool{}
	for k := range series {
		seen[k[:strings.IndexByte(k, '{')]] = true
	}
	var out []string
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestCollectorFreshness: the gauges are exported only by the holder and
// only while its last success is at most three intervals old; the
// timestamp and the holder flag always.
func TestCollectorFreshness(t *testing.T) {
	const interval = 10 * time.Second
	start := time.Unix(1_800_000_000, 0)
	always := []string{"cdcrelay_monitor_holder", "cdcrelay_monitor_last_success_timestamp_seconds"}
	all := append(append([]string(nil), always...), gaugeNames...)
	sort.Strings(all)
	cases := []struct {
		name      string
		held      bool
		refreshed bool          // a refresh succeeded at start
		elapsed   time.Duration // from start to the scrape
		want      []string
	}{
		{"holder, never refreshed", true, false, 0, always},
		{"holder, just refreshed", true, true, 0, all},
		{"holder, one interval ago", true, true, interval, all},
		{"holder, exactly three intervals ago", true, true, 3 * interval, all},
		{"holder, just over three intervals ago", true, true, 3*interval + time.Nanosecond, always},
		{"holder, an hour ago", true, true, time.Hour, always},
		{"not holder, just refreshed", false, true, 0, always},
		{"not holder, never refreshed", false, false, 0, always},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{t: start}
			c := newCollector("s1", interval, clock.now)
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(c)
			c.setHolder(tc.held)
			if tc.refreshed {
				c.succeeded(reading{unpublished: 7, parked: 2, oldest: 12.5, retained: 1024, lag: 512, safeWAL: -1, walStatus: "extended"})
			}
			clock.set(start.Add(tc.elapsed))
			got := exported(t, reg)
			if f := families(got); strings.Join(f, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("exported %v, want %v", f, tc.want)
			}
			wantTS := 0.0
			if tc.refreshed {
				wantTS = float64(start.Unix())
			}
			if ts := got["cdcrelay_monitor_last_success_timestamp_seconds{slot=s1}"]; ts != wantTS {
				t.Fatalf("last success %v, want %v", ts, wantTS)
			}
			if h := got["cdcrelay_monitor_holder{slot=s1}"]; h != boolValue(tc.held) {
				t.Fatalf("holder %v, want %v", h, tc.held)
			}
		})
	}
}

// TestCollectorValues: a fresh reading is exported as read, wal_status as
// one series per status.
func TestCollectorValues(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	c := newCollector("s1", time.Second, clock.now)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	c.setHolder(true)
	c.succeeded(reading{unpublished: 7, parked: 2, oldest: math.NaN(), retained: 1024, lag: 512, safeWAL: -1, walStatus: "unreserved", otherRelays: 1})
	got := exported(t, reg)
	want := map[string]float64{
		"cdcrelay_outbox_unpublished{slot=s1}":                     7,
		"cdcrelay_outbox_parked{slot=s1}":                          2,
		"cdcrelay_slot_retained_wal_bytes{slot=s1}":                1024,
		"cdcrelay_slot_lag_bytes{slot=s1}":                         512,
		"cdcrelay_slot_safe_wal_size_bytes{slot=s1}":               -1,
		"cdcrelay_slot_wal_status{slot=s1,status=reserved}":        0,
		"cdcrelay_slot_wal_status{slot=s1,status=extended}":        0,
		"cdcrelay_slot_wal_status{slot=s1,status=unreserved}":      1,
		"cdcrelay_slot_wal_status{slot=s1,status=lost}":            0,
		"cdcrelay_monitor_holder{slot=s1}":                         1,
		"cdcrelay_other_relay_slots{slot=s1}":                      1,
		"cdcrelay_monitor_last_success_timestamp_seconds{slot=s1}": 1_800_000_000,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if age, ok := got["cdcrelay_oldest_unpublished_age_seconds{slot=s1}"]; !ok || !math.IsNaN(age) {
		t.Errorf("oldest age %v (present %v), want NaN", age, ok)
	}
	if len(got) != len(want)+1 {
		t.Errorf("%d series, want %d: %v", len(got), len(want)+1, got)
	}
}

// TestCollectorValueTypes: ValueTypes names every metric Describe sends,
// so that the list of the relay's metrics (docs/metrics.txt) has them all.
func TestCollectorValueTypes(t *testing.T) {
	c := newCollector("s1", time.Second, time.Now)
	ch := make(chan *prometheus.Desc, 100)
	c.Describe(ch)
	close(ch)
	types := c.ValueTypes()
	n := 0
	for d := range ch {
		n++
		found := false
		for name := range types {
			found = found || strings.Contains(d.String(), `fqName: "`+name+`"`)
		}
		if !found {
			t.Errorf("no type for %s", d)
		}
	}
	if n != len(types) || n != len(gaugeNames)+2 {
		t.Fatalf("%d descs, %d types, want %d", n, len(types), len(gaugeNames)+2)
	}
}
