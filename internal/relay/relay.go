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

// Marker records the fate of events on their rows (the janitor): Mark for
// acknowledged ones, Park for poison ones.
type Marker interface {
	Mark(id string)
	Park(id, reason string)
}

// Role is what the relay is doing now.
type Role int32

// The roles.
const (
	RoleStarting  Role = iota // connecting, or backing off after a failure
	RoleStreaming             // holds the slot and streams
	RoleStandby               // another relay holds the slot; this one waits to take over
)

func (r Role) String() string {
	return [...]string{"starting", "streaming", "standby"}[r]
}

// Relay moves outbox events from the slot to the broker until its context
// ends. Each session connects both sides afresh and starts from the slot's
// confirmed position; a failure discards the whole session (DESIGN.md
// invariant 3).
type Relay struct {
	cfg     config.Config
	mapping wal.Mapping
	target  slot.Target
	poison  publish.PoisonPolicy
	marker  Marker
	log     *slog.Logger
	metrics *metrics
	walM    *wal.Metrics
	pubM    *publish.Metrics

	role  atomic.Int32
	alive atomic.Int64 // unix nanos of the reader's last turn
}

// wedgedAfter is how long a streaming reader may go without a turn of its
// loop before Healthy reports it; the loop turns at least every 200ms.
const wedgedAfter = time.Minute

// Healthy reports an error when the process is alive but stuck: streaming
// with a reader that stopped turning.
func (r *Relay) Healthy() error {
	if r.Role() != RoleStreaming {
		return nil
	}
	if since := time.Since(time.Unix(0, r.alive.Load())); since > wedgedAfter {
		return fmt.Errorf("replication reader has not run for %s", since.Round(time.Second))
	}
	return nil
}

// New builds a relay from a validated configuration. marker, if not nil,
// receives the id of every acknowledged event.
func New(cfg config.Config, marker Marker, log *slog.Logger, reg prometheus.Registerer) (*Relay, error) {
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
		poison:  map[string]publish.PoisonPolicy{config.PoisonPark: publish.Park, config.PoisonStop: publish.Stop}[cfg.Poison],
		marker:  marker,
		log:     log,
		metrics: newMetrics(reg, cfg.Slot),
		walM:    wal.NewMetrics(reg),
		pubM:    publish.NewMetrics(reg),
	}, nil
}

// Role reports what the relay is doing now.
func (r *Relay) Role() Role { return Role(r.role.Load()) }

// Streaming reports whether a session is streaming now.
func (r *Relay) Streaming() bool { return r.Role() == RoleStreaming }

func (r *Relay) setRole(role Role) {
	if Role(r.role.Swap(int32(role))) != role {
		r.metrics.setRole(role)
	}
}

// Run runs sessions until ctx ends (a clean stop: nil) or a fatal error.
func (r *Relay) Run(ctx context.Context) error {
	defer r.setRole(RoleStarting)
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
		wait := r.cfg.StandbyRetry
		if errors.Is(err, slot.ErrBusy) {
			if r.Role() != RoleStandby {
				r.log.Info("slot is held by another relay; waiting as hot standby", "detail", err)
			}
			r.setRole(RoleStandby)
		} else {
			r.setRole(RoleStarting)
			// A session that ran for a while was healthy: start the backoff over.
			if time.Since(started) > r.cfg.BackoffMax {
				backoff = r.cfg.BackoffMin
			}
			wait = jitter(backoff)
			backoff = min(2*backoff, r.cfg.BackoffMax)
			r.metrics.restarts.Inc()
			r.log.Error("pipeline failed; restarting both sides from the slot", "error", err, "retry_in", wait.Round(time.Millisecond))
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil
		}
	}
}

// jitter spreads retries of many relays by ±20%.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// connectTimeout bounds a connection attempt to PostgreSQL (TCP connect
// and startup) unless the URL sets connect_timeout: a server that accepts
// but never answers must fail the attempt, not hang the relay.
const connectTimeout = 10 * time.Second

// session runs one pipeline. ctx ending asks for a graceful stop: read no
// more, wait up to ShutdownTimeout for in-flight confirms, confirm what was
// acked, return.
func (r *Relay) session(ctx context.Context) error {
	dbCfg, err := pgx.ParseConfig(r.cfg.DatabaseURL)
	if err != nil {
		return errors.New("parse CDCRELAY_DATABASE_URL: not a valid connection string")
	}
	if dbCfg.ConnectTimeout == 0 {
		dbCfg.ConnectTimeout = connectTimeout
	}
	db, err := pgx.ConnectConfig(ctx, dbCfg)
	if err != nil {
		r.metrics.connectFailures.WithLabelValues("postgres").Inc()
		return fmt.Errorf("connect to database: %w", err)
	}
	// The normal connection serves the setup and the adoption only; it also
	// holds the adoption lock, which closing it releases.
	closeDB := func() {
		if db != nil {
			_ = db.Close(context.WithoutCancel(ctx))
			db = nil
		}
	}
	defer closeDB()
	info, interval, adopting, err := r.prepare(ctx, db)
	if err != nil {
		return err
	}

	repl, err := r.connectReplication(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = repl.Close(cctx)
	}()

	var link *publish.Link
	defer func() {
		if link != nil {
			_ = link.Close()
		}
	}()
	start := info.ConfirmedFlush
	if !info.Exists {
		if link, err = r.dial(ctx); err != nil {
			return err
		}
		if start, err = r.adopt(ctx, db, repl, link, adopting); err != nil {
			return err
		}
	}
	closeDB()
	if err := r.startReplication(ctx, repl); err != nil {
		return err
	}
	if link == nil {
		if link, err = r.dial(ctx); err != nil {
			return err
		}
	}
	return r.stream(ctx, repl, link, start, interval)
}

// prepare makes sure the publication exists, then looks at the slot:
// another relay holding it makes this one a standby; an invalidated slot or
// an interrupted adoption is dropped so that it is created again with a
// snapshot backfill. adopting reports that prepare already holds the
// adoption lock.
func (r *Relay) prepare(ctx context.Context, db *pgx.Conn) (info slot.Info, interval time.Duration, adopting bool, err error) {
	info, interval, err = r.inspect(ctx, db)
	if err != nil || !info.Exists {
		return info, interval, false, err
	}
	switch {
	case info.Active:
		return info, 0, false, fmt.Errorf("%w: slot %s is active", slot.ErrBusy, r.cfg.Slot)
	case info.Lost:
		r.metrics.slotLost.Inc()
		if r.cfg.SlotLost == config.SlotLostStop {
			return info, 0, false, fmt.Errorf("%w: slot %s has wal_status=lost (max_slot_wal_keep_size); events committed after its position may never have been published; set CDCRELAY_SLOT_LOST=recreate to recreate it and publish every row with published_at IS NULL", slot.ErrSlotLost, r.cfg.Slot)
		}
		r.log.Error("replication slot was invalidated (wal_status=lost); recreating it and publishing every unpublished row from its snapshot", "confirmed_flush", info.ConfirmedFlush)
	case info.Adopting:
		// The marker outlives only a relay that died while publishing the
		// backlog: a live adopter holds the lock, and BeginAdoption reports
		// ErrBusy before anything is dropped.
		if err := slot.BeginAdoption(ctx, db, r.cfg.Slot); err != nil {
			return info, 0, false, err
		}
		adopting = true
		r.log.Warn("the previous adoption of this slot was interrupted; recreating the slot and publishing the backlog again")
	default:
		return info, interval, false, nil
	}
	if err := slot.Drop(ctx, db, r.cfg.Slot); err != nil {
		return info, 0, adopting, err
	}
	return slot.Info{}, interval, adopting, nil
}

// inspect creates the publication if needed and reads the slot's state.
func (r *Relay) inspect(ctx context.Context, db *pgx.Conn) (slot.Info, time.Duration, error) {
	created, err := slot.EnsurePublication(ctx, db, r.target)
	if err != nil {
		return slot.Info{}, 0, err
	}
	if created {
		r.log.Info("created publication", "publication", r.target.Publication, "table", r.cfg.Table)
	}
	interval, err := slot.StatusInterval(ctx, db, r.cfg.StatusInterval)
	if err != nil {
		return slot.Info{}, 0, err
	}
	info, err := slot.Inspect(ctx, db, r.target)
	return info, interval, err
}

// adopt creates the slot and publishes every row with published_at IS NULL
// from its exported snapshot before streaming starts (DESIGN.md invariant
// 7). It returns the slot's consistent point.
func (r *Relay) adopt(ctx context.Context, db *pgx.Conn, repl *pgconn.PgConn, link *publish.Link, locked bool) (pglogrepl.LSN, error) {
	if !locked {
		if err := slot.BeginAdoption(ctx, db, r.cfg.Slot); err != nil {
			return 0, err
		}
	}
	created, err := slot.Create(ctx, repl, r.cfg.Slot)
	if err != nil {
		return 0, err
	}
	r.log.Info("created replication slot; publishing the rows committed before it", "consistent_point", created.ConsistentPoint)
	began := time.Now()
	seq := slot.NewWatermark(0)
	events := make(chan wal.Event, eventBuffer)
	drained := make(chan struct{})
	publisher := r.publisher(link, events, acks{seq, r.marker}, drained)
	var n int
	// A stop ends the adoption at once, even a publish blocked in a socket
	// write (invariant 5, docs/reliability.md); it starts again next time.
	defer context.AfterFunc(ctx, link.Abort)()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		var err error
		n, err = slot.Backfill(gctx, db, created, r.mapping, seq, events)
		return err
	})
	g.Go(func() error { return publisher.Run(gctx) })
	if err := g.Wait(); err != nil {
		return 0, fmt.Errorf("publish backlog: %w", err)
	}
	if err := slot.EndAdoption(ctx, db, r.cfg.Slot); err != nil {
		return 0, err
	}
	r.metrics.backfilled.Add(float64(n))
	r.log.Info("published the backlog", "events", n, "took", time.Since(began).Round(time.Millisecond))
	return created.ConsistentPoint, nil
}

// stream runs the reader and the publisher until failure or stop.
func (r *Relay) stream(ctx context.Context, repl *pgconn.PgConn, link *publish.Link, start pglogrepl.LSN, interval time.Duration) error {
	// hard ends the session at once; ctx only asks it to drain, and the
	// drain gets ShutdownTimeout before hard follows.
	hard, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopDrain := context.AfterFunc(ctx, func() { time.AfterFunc(r.cfg.ShutdownTimeout, cancel) })
	defer stopDrain()
	// When hard ends the session, a publish blocked in a socket write (a
	// broker that stopped reading) would still hold it: close the socket
	// (invariant 5, docs/reliability.md).
	defer context.AfterFunc(hard, link.Abort)()

	marks := slot.NewWatermark(start)
	events := make(chan wal.Event, eventBuffer)
	drained := make(chan struct{})
	reader := &wal.Reader{
		Conn: repl, Decoder: wal.NewDecoder(r.mapping), Marks: marks, Out: events,
		StatusInterval: interval, Timeout: 3 * interval, Stop: ctx.Done(), Drained: drained,
		Log: r.log, Metrics: r.walM, Alive: &r.alive,
	}
	publisher := r.publisher(link, events, acks{marks, r.marker}, drained)
	r.log.Info("streaming", "from", start, "status_interval", interval)
	r.alive.Store(time.Now().UnixNano())
	r.setRole(RoleStreaming)

	g, gctx := errgroup.WithContext(hard)
	g.Go(func() error { return reader.Run(gctx) })
	g.Go(func() error { return publisher.Run(gctx) })
	err := g.Wait()
	if ctx.Err() != nil {
		r.log.Info("stopped", "confirmed", reader.Sent(), "unconfirmed_events", marks.Pending())
	}
	return err
}

func (r *Relay) publisher(link *publish.Link, in <-chan wal.Event, a publish.Acker, drained chan<- struct{}) *publish.Publisher {
	return &publish.Publisher{
		Link: link, In: in, Acks: a, Exchange: r.cfg.Exchange,
		MaxInFlight: r.cfg.MaxInFlight, MaxInFlightBytes: int64(r.cfg.MaxInFlightBytes),
		ConfirmTimeout: r.cfg.ConfirmTimeout, Drained: drained,
		MaxMessageBytes: int64(r.cfg.MaxMessageBytes), Poison: r.poison, DeadLetterExchange: r.cfg.DeadLetterExchange,
		Log: r.log, Metrics: r.pubM,
	}
}

// acks hands each confirm to the watermark and the janitor.
type acks struct {
	marks  *slot.Watermark
	marker Marker
}

func (a acks) Ack(seq uint64, id string) {
	a.marks.Ack(seq)
	if a.marker != nil {
		a.marker.Mark(id)
	}
}

// Parked moves the watermark past a poison event: it is recorded on its
// row (and dead-lettered if configured), never published as is.
func (a acks) Parked(seq uint64, id, reason string) {
	a.marks.Ack(seq)
	if a.marker != nil {
		a.marker.Park(id, reason)
	}
}

func (r *Relay) dial(ctx context.Context) (*publish.Link, error) {
	tlsConfig, err := r.cfg.AMQPTLS()
	if err != nil {
		return nil, fmt.Errorf("broker TLS: %w", err)
	}
	link, err := publish.Dial(ctx, publish.DialOptions{
		URL: r.cfg.AMQPURL, Heartbeat: r.cfg.AMQPHeartbeat, TLS: tlsConfig,
		Exchanges: []string{r.cfg.Exchange, r.cfg.DeadLetterExchange},
		Name:      "cdcrelay " + r.cfg.Slot, Window: r.cfg.MaxInFlight, Channels: r.cfg.PublishChannels,
	})
	if err != nil {
		r.metrics.connectFailures.WithLabelValues("broker").Inc()
		return nil, err
	}
	r.metrics.connectedTo("broker")
	return link, nil
}

// connectReplication opens the replication connection.
func (r *Relay) connectReplication(ctx context.Context) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(r.cfg.DatabaseURL)
	if err != nil {
		return nil, errors.New("parse CDCRELAY_DATABASE_URL: not a valid connection string")
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "cdcrelay"
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeout
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		r.metrics.connectFailures.WithLabelValues("postgres").Inc()
		return nil, fmt.Errorf("open replication connection: %w", err)
	}
	r.metrics.connectedTo("postgres")
	return conn, nil
}

// startReplication streams from the slot's confirmed position: start LSN 0
// lets the server choose it; the relay never picks a position of its own.
func (r *Relay) startReplication(ctx context.Context, conn *pgconn.PgConn) error {
	err := pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			fmt.Sprintf("publication_names '%s'", r.cfg.Publication),
		},
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55006" { // active for another PID
		return fmt.Errorf("%w: %s", slot.ErrBusy, pgErr.Message)
	}
	if err != nil {
		return fmt.Errorf("start replication on slot %s: %w", r.cfg.Slot, err)
	}
	return nil
}
