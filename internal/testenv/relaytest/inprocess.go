package relaytest

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/relay"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// InProcess is a relay running in the test process (under -race), with
// its own metrics registry and a copy of everything it logged.
type InProcess struct {
	*testenv.Background
	Relay *relay.Relay
	Reg   *prometheus.Registry
	Logs  *testenv.Buffer
}

// InProcessOptions say where the logs go. What runs is always the
// shipped service (relay.NewService: relay, janitor, retention, monitor),
// so every test exercises the marks that gate the slot (invariant 10, docs/architecture.md).
type InProcessOptions struct {
	// Level is the log level; LogTo, when set, receives the log too.
	Level slog.Level
	LogTo io.Writer
}

// Start runs the relay with cfg in the background. The caller stops it
// (Stop) when the test ends, judging the result its own way.
func Start(t testing.TB, cfg config.Config, o InProcessOptions) *InProcess {
	t.Helper()
	logs := &testenv.Buffer{}
	var w io.Writer = logs
	if o.LogTo != nil {
		w = io.MultiWriter(o.LogTo, logs)
	}
	log := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: o.Level}))
	r := &InProcess{Reg: prometheus.NewRegistry(), Logs: logs}
	svc, err := relay.NewService(cfg, log, r.Reg)
	if err != nil {
		t.Fatal(err)
	}
	r.Relay = svc.Relay
	r.Background = testenv.Go(svc.Run)
	return r
}

// WaitStreaming waits (30 s) until the relay streams from its slot.
func (r *InProcess) WaitStreaming(t testing.TB) {
	t.Helper()
	r.WaitFor(t, 30*time.Second, "streaming", r.Relay.Streaming)
}
