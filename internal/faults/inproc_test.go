package faults_test

import (
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// inproc is a relay running in the test process (under -race), without a
// janitor: it marks published_at, which these tests do not check, and the
// relay binary (startProcess) runs with one anyway.
type inproc struct {
	*relaytest.InProcess
}

func (w *world) startRelay(extra map[string]string) *inproc {
	w.t.Helper()
	cfg := relaytest.Config(w.t, w.vars(extra))
	level, _ := cfg.Level()
	run := &inproc{relaytest.Start(w.t, cfg, relaytest.InProcessOptions{Level: level})}
	w.t.Cleanup(func() {
		if err := run.Stop(); err != nil {
			w.t.Errorf("relay: %v", err)
		}
		if w.t.Failed() {
			w.t.Logf("relay log (last 60 lines):\n%s", testenv.Tail(run.Logs.String(), 60))
		}
	})
	return run
}

func (r *inproc) waitStreaming(t *testing.T) {
	t.Helper()
	r.WaitStreaming(t)
}

// running fails the test if the relay has exited.
func (r *inproc) running(t *testing.T) {
	t.Helper()
	if exited, err := r.Exited(); exited {
		t.Fatalf("relay exited: %v", err)
	}
}

// metric sums the values of a counter or gauge family.
func (r *inproc) metric(t *testing.T, name string) float64 {
	t.Helper()
	fams, err := r.Reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			}
		}
	}
	return sum
}

// failures returns the errors of the relay's "pipeline failed" log lines.
func (r *inproc) failures() []string {
	var out []string
	for _, line := range strings.Split(r.Logs.String(), "\n") {
		if !strings.Contains(line, "pipeline failed") {
			continue
		}
		if i := strings.Index(line, "error="); i >= 0 {
			out = append(out, line[i+len("error="):])
		}
	}
	return out
}

// transportFailuresOnly checks that a link fault was reported as one
// (invariant 3, docs/architecture.md: transport failures never count as a poisoned
// event): no nack or return was counted and every failure logged says so.
func (r *inproc) transportFailuresOnly(t *testing.T) {
	t.Helper()
	if n := r.metric(t, "cdcrelay_returns_total"); n != 0 {
		t.Errorf("a broker link fault was counted as %v returned (unroutable) messages", n)
	}
	if n := r.metric(t, "cdcrelay_nacks_total"); n != 0 {
		t.Errorf("a broker link fault was counted as %v nacks", n)
	}
	for _, f := range r.failures() {
		if strings.Contains(f, "unroutable") || strings.Contains(f, "nacked") {
			t.Errorf("a link fault was reported as a broker verdict on an event: %s", f)
		}
	}
}

// restarts is the relay's pipeline restart counter.
func (r *inproc) restarts(t *testing.T) int {
	return int(r.metric(t, "cdcrelay_pipeline_restarts_total"))
}
