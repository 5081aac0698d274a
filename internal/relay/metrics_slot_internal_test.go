package relay

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sethvargo/go-envconfig"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// descRecorder remembers the descriptors of every collector registered
// through it: a vector with no series yet (cdcrelay_stalled_event_info)
// shows its constant labels there and nowhere else.
type descRecorder struct {
	*prometheus.Registry
	descs map[string]string // metric name -> Desc.String()
}

func (r *descRecorder) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	for d := range ch {
		s := d.String()
		name, _, _ := strings.Cut(strings.TrimPrefix(s, `Desc{fqName: "`), `"`)
		r.descs[name] = s
	}
	return nil
}

func (r *descRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// TestAlertMetricsCarrySlot: every metric an alert of the Helm chart reads
// carries the relay's slot as a constant label, so that each alert names
// the slot (and, through it, the source) it is about.
func TestAlertMetricsCarrySlot(t *testing.T) {
	const slot = "cdcrelay_orders"
	cfg, err := config.LoadFrom(context.Background(), envconfig.MapLookuper(map[string]string{
		config.Prefix + "DATABASE_URL": "postgres://cdcrelay@127.0.0.1:1/app",
		config.Prefix + "AMQP_URL":     "amqp://guest:guest@127.0.0.1:1/",
		config.Prefix + "EXCHANGE":     "events",
		config.Prefix + "SLOT":         slot,
	}))
	if err != nil {
		t.Fatal(err)
	}
	rec := &descRecorder{Registry: prometheus.NewPedanticRegistry(), descs: map[string]string{}}
	if _, err := NewService(cfg, slog.New(slog.DiscardHandler), rec); err != nil {
		t.Fatal(err)
	}
	want := `constLabels: {slot="` + slot + `"}`
	for _, name := range []string{
		// the publisher's
		"cdcrelay_nacks_total", "cdcrelay_poison_events_total", "cdcrelay_broker_blocked",
		"cdcrelay_commit_to_ack_seconds", "cdcrelay_stalled_event_info", "cdcrelay_dead_letter_failures_total",
		// the stream's, the pipeline's, the janitor's, retention's
		"cdcrelay_foreign_inserts_skipped_total", "cdcrelay_pipeline_restarts_total", "cdcrelay_marks_failing_seconds",
		"cdcrelay_retention_errors_total", "cdcrelay_retention_runs_total", "cdcrelay_retention_last_success_timestamp_seconds",
		// slot-labelled before
		"cdcrelay_role", "cdcrelay_slot_lost_total", "cdcrelay_backfill_events_total",
	} {
		d, ok := rec.descs[name]
		switch {
		case !ok:
			t.Errorf("%s is not registered", name)
		case !strings.Contains(d, want):
			t.Errorf("%s: %s, want the constant label slot=%q", name, d, slot)
		}
	}
	// The stalled row's own labels stay variable labels beside the slot.
	if d := rec.descs["cdcrelay_stalled_event_info"]; !strings.Contains(d, "variableLabels: {id,exchange,routing_key,cause}") {
		t.Errorf("cdcrelay_stalled_event_info: %s", d)
	}
}
