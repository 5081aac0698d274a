// Package relay wires the WAL reader and the publisher into sessions and
// restarts them from the slot after any failure.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// eventBuffer is how many decoded events may wait between the reader and
// the publisher; the in-flight window sits behind it.
const eventBuffer = 256

// Relay moves outbox events from the slot to the broker until its context
// ends. Each session connects both sides afresh and starts from the slot's
// confirmed position; a failure discards the whole session (DESIGN.md
// invariant 3).
type Relay struct {
	cfg     config.Config
	mapping wal.Mapping
	target  slot.Target
	log     *slog.Logger
	metrics *metrics
	walM    *wal.Metrics
	pubM    *publish.Metrics

	streaming atomic.Bool
}

// New builds a relay from a validated configuration.
func New(cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (*Relay, error) {
	schema, table, err := config.SplitTable(cfg.Table)
	if err != nil {
		return nil, err
	}
	return &Relay{
		cfg: cfg,
		mapping: wal.Mapping{
			Schema: schema, Table: table,
			ID: cfg.IDColumn, RoutingKey: cfg.RoutingKeyColumn, Payload: cfg.PayloadColumn,
			Headers: cfg.HeadersColumn, Exchange: cfg.ExchangeColumn, MessageType: cfg.TypeColumn,
		},
		target:  slot.Target{Publication: cfg.Publication, Slot: cfg.Slot, Schema: schema, Table: table},
		log:     log,
		metrics: newMetrics(reg),
		walM:    wal.NewMetrics(reg),
		pubM:    publish.NewMetrics(reg),
	}, nil
}

// Streaming reports whether a session is streaming now.
func (r *Relay) Streaming() bool { return r.streaming.Load() }

// Run runs sessions until ctx ends (a clean stop: nil) or a fatal error.
func (r *Relay) Run(ctx context.Context) error {
	backoff := r.cfg.BackoffMin
	for {
		started := time.Now()
		err := r.session(ctx)
		if ctx.Err() != nil {
			if err != nil && !errors.Is(err, context.Canceled) {
				r.log.Warn("stopped with unconfirmed events; they will be published again on the next start", "error", err)
			}
			return nil
		}
		if Fatal(err) {
			return err
		}
		// A session that ran for a while was healthy: start the backoff over.
		if time.Since(started) > r.cfg.BackoffMax {
			backoff = r.cfg.BackoffMin
		}
		wait := jitter(backoff)
		r.metrics.restarts.Inc()
		r.log.Error("pipeline failed; restarting both sides from the slot", "error", err, "retry_in", wait.Round(time.Millisecond))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil
		}
		backoff = min(2*backoff, r.cfg.BackoffMax)
	}
}

// jitter spreads retries of many relays by ±20%.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// session runs one pipeline. ctx ending asks for a graceful stop: read no
// more, wait up to ShutdownTimeout for in-flight confirms, confirm what was
// acked, return.
func (r *Relay) session(ctx context.Context) error {
	st, err := r.prepare(ctx)
	if err != nil {
		return err
	}
	link, err := publish.Dial(ctx, publish.DialOptions{
		URL: r.cfg.AMQPURL, Heartbeat: r.cfg.AMQPHeartbeat, Exchange: r.cfg.Exchange,
		Name: "cdcrelay " + r.cfg.Slot, Window: r.cfg.MaxInFlight,
	})
	if err != nil {
		r.metrics.reconnects.WithLabelValues("broker").Inc()
		return err
	}
	defer func() { _ = link.Close() }()

	repl, err := r.startReplication(ctx)
	if err != nil {
		r.metrics.reconnects.WithLabelValues("postgres").Inc()
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = repl.Close(cctx)
	}()

	// hard ends the session at once; ctx only asks it to drain, and the
	// drain gets ShutdownTimeout before hard follows.
	hard, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopDrain := context.AfterFunc(ctx, func() { time.AfterFunc(r.cfg.ShutdownTimeout, cancel) })
	defer stopDrain()

	marks := slot.NewWatermark(st.ConfirmedFlush)
	events := make(chan wal.Event, eventBuffer)
	drained := make(chan struct{})
	reader := &wal.Reader{
		Conn: repl, Decoder: wal.NewDecoder(r.mapping), Marks: marks, Out: events,
		StatusInterval: st.StatusInterval, Stop: ctx.Done(), Drained: drained,
		Log: r.log, Metrics: r.walM,
	}
	publisher := &publish.Publisher{
		Link: link, In: events, Acks: marks, Exchange: r.cfg.Exchange,
		MaxInFlight: r.cfg.MaxInFlight, MaxInFlightBytes: int64(r.cfg.MaxInFlightBytes),
		ConfirmTimeout: r.cfg.ConfirmTimeout, Drained: drained,
		Log: r.log, Metrics: r.pubM,
	}
	r.log.Info("streaming", "from", st.ConfirmedFlush, "slot_created", st.Created, "status_interval", st.StatusInterval)
	r.streaming.Store(true)
	defer r.streaming.Store(false)

	g, gctx := errgroup.WithContext(hard)
	g.Go(func() error { return reader.Run(gctx) })
	g.Go(func() error { return publisher.Run(gctx) })
	err = g.Wait()
	if ctx.Err() != nil {
		r.log.Info("stopped", "confirmed", reader.Sent(), "unconfirmed_events", marks.Pending())
	}
	return err
}

// prepare makes sure the publication and slot exist, in that order.
func (r *Relay) prepare(ctx context.Context) (slot.State, error) {
	db, err := pgx.Connect(ctx, r.cfg.DatabaseURL)
	if err != nil {
		r.metrics.reconnects.WithLabelValues("postgres").Inc()
		return slot.State{}, fmt.Errorf("connect to database: %w", err)
	}
	defer func() { _ = db.Close(context.WithoutCancel(ctx)) }()
	created, err := slot.EnsurePublication(ctx, db, r.target)
	if err != nil {
		return slot.State{}, err
	}
	if created {
		r.log.Info("created publication", "publication", r.target.Publication, "table", r.cfg.Table)
	}
	st, err := slot.EnsureSlot(ctx, db, r.target, r.cfg.StatusInterval)
	if err != nil {
		return st, err
	}
	if st.Created {
		r.log.Info("created replication slot", "at", st.ConfirmedFlush)
	}
	return st, nil
}

// startReplication opens the replication connection and starts streaming
// from the slot's confirmed position (start LSN 0 lets the server choose it;
// the relay never picks a position of its own).
func (r *Relay) startReplication(ctx context.Context) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(r.cfg.DatabaseURL)
	if err != nil {
		return nil, errors.New("parse CDCRELAY_DATABASE_URL: not a valid connection string")
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "cdcrelay"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open replication connection: %w", err)
	}
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			fmt.Sprintf("publication_names '%s'", r.cfg.Publication),
		},
	})
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("start replication on slot %s: %w", r.cfg.Slot, err)
	}
	return conn, nil
}
