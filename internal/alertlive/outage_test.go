//go:build alerts

package alertlive_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// A broker outage, end to end through Prometheus: the chart's rules, a
// real scrape of the relay, the alert firing while the broker is cut off
// and resolving once it is back, and the events committed meanwhile
// delivered after it. The monitor keeps refreshing while nothing streams
// (CONTRACT: the monitor lock's holder refreshes whatever its role), so
// CdcrelayMonitorStale must stay quiet all along.
func TestIntegrationBrokerOutageFiresNoStreamingRelay(t *testing.T) {
	tl := requireTools(t)
	slot := testenv.UniqueName("alertlive")
	rules := renderRules(t, tl, slot)
	w := newWorld(t, slot)
	p := startPrometheus(t, tl, w.relayAddr, rules)
	p.waitRulesLoaded(t)
	stale := &quiet{p: p, alert: alertMonitorStale}

	// Before: the relay streams, events arrive, no alert.
	streaming := fmt.Sprintf(`cdcrelay_role{slot=%q,role="streaming"} == 1`, w.slot)
	p.waitFor(t, time.Minute, "relay scraped as streaming", hasSeries(p, streaming))
	w.waitDelivered(t, w.insert(t, 10), time.Minute)
	// Before the first scrape the rules see no relay at all, which may
	// leave an alert pending (or a just-started monitor stale) for a moment.
	p.waitFor(t, time.Minute, "no "+alertNoStreaming+" while streaming", noAlert(p, alertNoStreaming))
	p.waitFor(t, time.Minute, "no "+alertMonitorStale+" while streaming", noAlert(p, alertMonitorStale))
	p.holds(t, 3*time.Second, "no "+alertNoStreaming+" while streaming", noAlert(p, alertNoStreaming))

	// Outage: cut every relay connection to the broker and let new ones hang.
	cut := time.Now()
	w.proxy.Blackhole(true)
	w.proxy.Reset()
	during := w.insert(t, 20)
	p.waitFor(t, time.Minute, alertNoStreaming+" firing", stale.and(t, firing(p, alertNoStreaming)))
	// Long enough that a monitor which stopped refreshing at the cut would
	// be past the threshold for a few evaluations.
	p.waitFor(t, time.Minute, "outage past the monitorStale threshold", stale.and(t, func() (bool, error) {
		return time.Since(cut) > (monitorStaleSecond+5)*time.Second, nil
	}))
	w.checkOutage(t, p, during)

	// Recovery: the proxy passes traffic again.
	w.proxy.Blackhole(false)
	w.waitDelivered(t, during, 2*time.Minute)
	p.waitFor(t, time.Minute, "relay scraped as streaming again", stale.and(t, hasSeries(p, streaming)))
	p.waitFor(t, time.Minute, alertNoStreaming+" resolved", stale.and(t, noAlert(p, alertNoStreaming)))
	w.running(t)
}

// checkOutage checks the state in the middle of the outage: the relay is
// up and scraped (so the alert is about its role, not a missing target),
// its monitor still refreshed within the monitorStale threshold (so the
// quiet CdcrelayMonitorStale is a fresh monitor, not a missing series),
// exactly one alert (CONTRACT: one per incident) names the test's
// namespace and slot, and nothing committed since the cut got through.
func (w *world) checkOutage(t *testing.T, p *prom, during []string) {
	t.Helper()
	w.running(t)
	if n, err := p.query(`up{job="cdcrelay"} == 1`); err != nil || n != 1 {
		t.Errorf("relay scraped during the outage: %d up series (err %v), want 1", n, err)
	}
	fresh := fmt.Sprintf(`time() - cdcrelay_monitor_last_success_timestamp_seconds{slot=%q} < %d`, w.slot, monitorStaleSecond)
	if n, err := p.query(fresh); err != nil || n != 1 {
		t.Errorf("monitor refreshed within %ds while nothing streams: %d series for %s (err %v), want 1",
			monitorStaleSecond, n, fresh, err)
	}
	as, err := p.alerts(alertNoStreaming)
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != 1 {
		t.Errorf("%d %s alerts during one outage of one source, want 1: %+v", len(as), alertNoStreaming, as)
	}
	for _, a := range as {
		if a.State != "firing" || a.Labels["slot"] != w.slot || a.Labels["source"] != "default" || a.Labels["namespace"] != ruleNamespace ||
			a.Labels["severity"] != "critical" {
			t.Errorf("%s alert %+v: want firing, slot %s, source default, namespace %s, severity critical", alertNoStreaming, a, w.slot, ruleNamespace)
		}
	}
	if n := w.delivered(during); n != 0 {
		t.Errorf("%d events committed after the cut were delivered during the outage: the proxy did not cut the broker off", n)
	}
}

// waitRulesLoaded waits until Prometheus has evaluated the alerting rules
// and checks that the two under test are there and healthy.
func (p *prom) waitRulesLoaded(t *testing.T) {
	t.Helper()
	var rules map[string]string
	p.waitFor(t, time.Minute, "alerting rules evaluated", func() (bool, error) {
		var err error
		rules, err = p.alertingRules()
		if err != nil || len(rules) == 0 {
			return false, err
		}
		for _, h := range rules {
			if h == "unknown" {
				return false, nil
			}
		}
		return true, nil
	})
	for _, name := range []string{alertNoStreaming, alertMonitorStale} {
		if h, ok := rules[name]; !ok || h != "ok" {
			t.Errorf("alerting rule %s: loaded %v, health %q; rules: %v", name, ok, h, rules)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// quiet watches an alert that must never be pending or firing from the
// moment it is first checked: the test fails (once, carrying on) if it is.
type quiet struct {
	p      *prom
	alert  string
	failed bool
}

func (q *quiet) check(t *testing.T) {
	t.Helper()
	as, err := q.p.alerts(q.alert)
	if err != nil {
		t.Fatal(err)
	}
	if len(as) > 0 && !q.failed {
		q.failed = true
		t.Errorf("%s became %s during the outage or recovery: %+v", q.alert, as[0].State, as)
	}
}

// and returns cond, checking the watched alert first on every poll.
func (q *quiet) and(t *testing.T, cond func() (bool, error)) func() (bool, error) {
	return func() (bool, error) {
		q.check(t)
		return cond()
	}
}

// holds polls cond for the whole of d; the test fails the first time it
// does not hold.
func (p *prom) holds(t *testing.T, d time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if ok, err := cond(); err != nil || !ok {
			t.Fatalf("not %s (err %v)", what, err)
		}
	}
}

// hasSeries holds when the instant query q yields a series.
func hasSeries(p *prom, q string) func() (bool, error) {
	return func() (bool, error) {
		n, err := p.query(q)
		return n > 0, err
	}
}

// noAlert holds when no alert named name is pending or firing.
func noAlert(p *prom, name string) func() (bool, error) {
	return func() (bool, error) {
		as, err := p.alerts(name)
		return len(as) == 0, err
	}
}

// firing holds when an alert named name fires.
func firing(p *prom, name string) func() (bool, error) {
	return func() (bool, error) {
		as, err := p.alerts(name)
		for _, a := range as {
			if a.State == "firing" {
				return true, err
			}
		}
		return false, err
	}
}
