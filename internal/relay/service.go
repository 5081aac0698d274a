package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/janitor"
	"github.com/cdcrelay/cdcrelay/internal/monitor"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/retention"
)

// Service is the relay with the stages that run beside it: the janitor,
// retention and the monitor. The relay decides when the service ends; the
// others follow.
type Service struct {
	Relay     *Relay
	janitor   *janitor.Janitor
	monitor   *monitor.Monitor
	retention *retention.Retention
}

// NewService builds the stages from a validated configuration.
func NewService(cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (*Service, error) {
	outbox, err := cfg.Outbox()
	if err != nil {
		return nil, err
	}
	// Built in dependency order: the relay records each event's fate
	// through the janitor, and retention follows the relay's role.
	jan := janitor.New(janitor.Options{
		DatabaseURL: cfg.DatabaseURL, SlotDatabaseURL: cfg.ReplicationURL, Origin: originName(cfg, "marks"), Outbox: outbox,
		MarkInterval: cfg.MarkInterval, MarkBatch: cfg.MarkBatch,
		BackoffMin: cfg.MarkInterval, BackoffMax: min(cfg.BackoffMax, 5*time.Second),
	}, log.With("stage", "janitor"), reg)
	rel, err := newRelay(cfg, jan, log, reg)
	if err != nil {
		return nil, err
	}
	s := &Service{Relay: rel, janitor: jan}
	s.retention = retention.New(retention.Options{
		DatabaseURL: cfg.DatabaseURL, Origin: originName(cfg, "retention"), Outbox: outbox,
		Retention: time.Duration(cfg.Retention), Interval: time.Duration(cfg.RetentionInterval),
		Batch: cfg.RetentionBatch, Active: rel.Streaming,
	}, log.With("stage", "retention"), reg)
	// The monitor does not follow the role: whichever replica holds the
	// monitor lock refreshes, so the gauges stay fresh when nothing streams.
	s.monitor = monitor.New(monitor.Options{
		DatabaseURL: cfg.DatabaseURL, SlotDatabaseURL: cfg.ReplicationURL, Outbox: outbox,
		Interval: cfg.MonitorInterval,
	}, log.With("stage", "monitor"), reg)
	return s, nil
}

// Run runs every stage until the relay returns: nil after a graceful stop
// (ctx ended), the fatal error otherwise. The janitor gets to flush the
// marks it holds before Run returns.
func (s *Service) Run(ctx context.Context) error {
	stages, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	g := new(errgroup.Group)
	g.Go(func() error { return s.janitor.Run(stages) })
	g.Go(func() error { return s.monitor.Run(stages) })
	g.Go(func() error { return s.retention.Run(stages) })
	err := s.Relay.Run(ctx)
	stop()
	_ = g.Wait() // the other stages only end with stages
	return err
}

// originName names the replication origin a stage's transactions carry
// (CDCRELAY_MARK_ORIGIN; origin.go), "" when off. One per stage: a
// PostgreSQL origin serves one session at a time.
func originName(cfg config.Config, stage string) string {
	if cfg.MarkOrigin == config.MarkOriginOff {
		return ""
	}
	return pgconnect.OriginPrefix + cfg.Slot + "_" + stage
}
