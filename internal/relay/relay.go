// Package relay wires the WAL reader and the publisher into sessions and
// restarts them from the slot after any failure.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgerr"
	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// eventBuffer is how many decoded events may wait between the reader and
// the publisher; the in-flight window sits behind it. Their bytes count
// against the session's byte budget with those in flight (budget).
const eventBuffer = 256

// Marker records the fate of events on their rows (the janitor): Mark for
// acknowledged ones, Park for poison ones. It calls done once the row is
// marked, parked or found gone; only then does the slot's watermark learn
// of the event, so the slot never passes an unmarked row (invariant 10,
// docs/reliability.md). Mark and Park may wait for room until ctx ends
// (back-pressure on the confirm loop); then done is never called. Flush
// asks for the queued work to be written now.
type Marker interface {
	Mark(ctx context.Context, id string, done func()) error
	Park(ctx context.Context, id, reason string, done func()) error
	Flush()
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
// confirmed position; a failure discards the whole session (docs/architecture.md
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
	// refused outlives sessions: events the client library could not
	// encode, parked by the next session instead of published again.
	refused *publish.Refusals

	role     atomic.Int32
	alive    atomic.Int64           // unix nanos of the reader's last turn
	adopting atomic.Bool            // a new slot's backlog is being published
	detail   atomic.Pointer[string] // what a starting relay waits for (see Status)
	lockPID  atomic.Uint32          // backend pid of the last session's slot lock connection
	owner    atomic.Bool            // the session holds the slot lock (see Owner)
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
			MaxMessageBytes: int64(cfg.MaxMessageBytes),
		},
		target:  slot.Target{Publication: cfg.Publication, Slot: cfg.Slot, Schema: schema, Table: table},
		poison:  map[string]publish.PoisonPolicy{config.PoisonPark: publish.Park, config.PoisonStop: publish.Stop}[cfg.Poison],
		marker:  marker,
		log:     log,
		metrics: newMetrics(reg, cfg.Slot),
		walM:    wal.NewMetrics(reg),
		pubM:    publish.NewMetrics(reg),
		refused: &publish.Refusals{},
	}, nil
}

// Role reports what the relay is doing now.
func (r *Relay) Role() Role { return Role(r.role.Load()) }

// Streaming reports whether a session is streaming now.
func (r *Relay) Streaming() bool { return r.Role() == RoleStreaming }

// Adopting reports whether this relay holds a new slot and publishes the
// rows committed before it (adoption or slot recreation).
func (r *Relay) Adopting() bool { return r.adopting.Load() }

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
			// A relay of this version waits for the slot lock in session;
			// this is a slot held outside it, which can only be retried.
			if r.Role() != RoleStandby {
				r.log.Info("slot is held by a process outside the slot lock; retrying every CDCRELAY_STANDBY_RETRY", "detail", err)
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
			r.setDetail(r.retryDetail(err)) // /readyz says why until the next session streams
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
// acked, return. Everything it does to the slot happens under the slot
// lock, taken first on a connection of its own and held until the session
// ends: a standby waits for it there, and closing it releases it.
func (r *Relay) session(ctx context.Context) (err error) {
	lock, err := r.connectLock(ctx)
	if err != nil {
		return err
	}
	var f *fence
	// Deferred first, this runs last: the lock is released only once the
	// replication connection is closed and this relay has let go of the slot.
	defer func() {
		if f != nil {
			err = f.explain(err)
			f.stop()
		}
		_ = lock.Close(context.WithoutCancel(ctx))
	}()
	if err := r.acquire(ctx, lock); err != nil {
		return err
	}
	r.owner.Store(true)
	defer r.owner.Store(false)
	// The lock's connection stays idle from here on; losing it ends the
	// session at once: work is cancelled and the replication socket closed.
	work, cancelWork := context.WithCancel(ctx)
	defer cancelWork()
	f = r.startFence(lock, cancelWork)

	db, err := r.connectDB(work)
	if err != nil {
		return err
	}
	// The normal connection serves the setup and the adoption only.
	closeDB := func() {
		if db != nil {
			_ = db.Close(context.WithoutCancel(ctx))
			db = nil
		}
	}
	defer closeDB()
	info, interval, adopting, err := r.prepare(work, db)
	if err != nil {
		return err
	}

	repl, err := r.connectReplication(work)
	if err != nil {
		return err
	}
	f.guard(repl)
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
		if link, err = r.dial(work); err != nil {
			return err
		}
		if start, err = r.adopt(work, db, repl, link, adopting); err != nil {
			return err
		}
	}
	closeDB()
	if err := r.startReplication(work, repl); err != nil {
		return err
	}
	if link == nil {
		if link, err = r.dial(work); err != nil {
			return err
		}
	}
	return r.stream(ctx, repl, link, start, interval)
}

// connectDB opens the normal connection to the service database.
func (r *Relay) connectDB(ctx context.Context) (*pgx.Conn, error) {
	dbCfg, err := pgx.ParseConfig(r.cfg.DatabaseURL)
	if err != nil {
		return nil, errors.New("parse CDCRELAY_DATABASE_URL: not a valid connection string")
	}
	if dbCfg.ConnectTimeout == 0 {
		dbCfg.ConnectTimeout = connectTimeout
	}
	db, err := pgx.ConnectConfig(ctx, dbCfg)
	if err != nil {
		r.metrics.connectFailures.WithLabelValues("postgres").Inc()
		return nil, fmt.Errorf("connect to database: %w", pgerr.Connect(err))
	}
	return db, nil
}

// prepare makes sure the publication exists, then looks at the slot, with
// the slot lock held: an invalidated slot or an interrupted adoption is
// dropped so that it is created again with a snapshot backfill. adopting
// reports that prepare already holds the adoption lock.
func (r *Relay) prepare(ctx context.Context, db *pgx.Conn) (info slot.Info, interval time.Duration, adopting bool, err error) {
	info, interval, err = r.inspect(ctx, db)
	if err != nil || !info.Exists {
		return info, interval, false, err
	}
	switch {
	case info.Lost:
		r.metrics.slotLost.Inc()
		if r.cfg.SlotLost == config.SlotLostStop {
			return info, 0, false, fmt.Errorf("%w: slot %s has wal_status=lost (max_slot_wal_keep_size); events committed after its position may never have been published; set CDCRELAY_SLOT_LOST=recreate to recreate it and publish every row with published_at IS NULL", slot.ErrSlotLost, r.cfg.Slot)
		}
		r.log.Error("replication slot was invalidated (wal_status=lost); recreating it and publishing every unpublished row from its snapshot", "confirmed_flush", info.ConfirmedFlush)
	case info.Adopting:
		// The marker outlives only a relay that died while publishing the
		// backlog: a live adopter of this version holds the slot lock, which
		// is ours, and one of an older version holds the adoption lock, for
		// which BeginAdoption reports ErrBusy before anything is dropped.
		if err := slot.BeginAdoption(ctx, db, r.cfg.Slot); err != nil {
			return info, 0, false, err
		}
		adopting = true
		r.log.Warn("the previous adoption of this slot was interrupted; recreating the slot and publishing the backlog again")
	default:
		// An active slot is the dead holder's walsender on its way out (or
		// a process outside the slot lock): startReplication waits for it.
		return info, interval, false, nil
	}
	if err := slot.Drop(ctx, db, r.cfg.Slot); err != nil {
		return info, 0, adopting, err
	}
	return slot.Info{}, interval, adopting, nil
}

// inspect creates the publication if needed and reads the slot's state.
// It then verifies that the publication publishes exactly the outbox table's inserts (else the
// session ends with a fatal ErrPublication naming the remedy) and maps the
// outbox by the table's OID for this session (invariant 9,
// docs/reliability.md).
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
	if err != nil {
		return info, interval, err
	}
	// Verified even when the slot is still active: with the slot lock held
	// that is a dead holder's walsender letting go, and this session will
	// stream as soon as it has.
	table, err := slot.VerifyPublication(ctx, db, r.target)
	if err != nil {
		return slot.Info{}, 0, err
	}
	r.mapping.OID = table.OID
	return info, interval, nil
}

// adopt creates the slot and publishes every row with published_at IS NULL
// from its exported snapshot before streaming starts (docs/architecture.md invariant
// 7). It returns the slot's consistent point.
func (r *Relay) adopt(ctx context.Context, db *pgx.Conn, repl *pgconn.PgConn, link *publish.Link, locked bool) (pglogrepl.LSN, error) {
	if !locked {
		if err := slot.BeginAdoption(ctx, db, r.cfg.Slot); err != nil {
			return 0, err
		}
	}
	created, err := r.createSlot(ctx, db, repl)
	if err != nil {
		return 0, err
	}
	r.adopting.Store(true)
	defer r.adopting.Store(false)
	r.log.Info("created replication slot; publishing the rows committed before it", "consistent_point", created.ConsistentPoint)
	began := time.Now()
	seq := slot.NewWatermark(0)
	rows := make(chan wal.Event)
	events := make(chan wal.Event, eventBuffer)
	drained := make(chan struct{})
	var n int
	// A stop ends the adoption at once, even a publish blocked in a socket
	// write (invariant 5, docs/architecture.md); it starts again next time.
	defer context.AfterFunc(ctx, link.Abort)()
	g, gctx := errgroup.WithContext(ctx)
	backlogAcks := newAcks(gctx, seq, r.marker)
	// Each confirm counts at once, so the counter shows the adoption's progress.
	backlogAcks.count = r.metrics.backfilled
	publisher := r.publisher(link, events, backlogAcks, drained)
	publisher.Budget = r.budget()
	g.Go(func() error {
		var err error
		n, err = slot.Backfill(gctx, db, created, r.mapping, seq, rows)
		return err
	})
	g.Go(func() error { return r.budgeted(gctx, publisher.Budget, rows, events) })
	g.Go(func() error { return publisher.Run(gctx) })
	if err := g.Wait(); err != nil {
		return 0, fmt.Errorf("publish backlog: %w", err)
	}
	// The backlog's rows are behind the slot's consistent point: they must
	// be marked before the adoption ends (invariant 10).
	if backlogAcks.wait(ctx); ctx.Err() != nil {
		return 0, ctx.Err()
	}
	if err := slot.EndAdoption(ctx, db, r.cfg.Slot); err != nil {
		return 0, err
	}
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
	// (invariant 5, docs/architecture.md).
	defer context.AfterFunc(hard, link.Abort)()

	marks := slot.NewWatermark(start)
	events := make(chan wal.Event, eventBuffer)
	drained := make(chan struct{})
	budget := r.budget()
	reader := &wal.Reader{
		Conn: repl, Decoder: wal.NewDecoder(r.mapping), Marks: marks, Out: events,
		StatusInterval: interval, Timeout: 3 * interval, Stop: ctx.Done(),
		Log: r.log, Metrics: r.walM, Alive: &r.alive,
		Budget: budget, BudgetBytes: int64(r.cfg.MaxInFlightBytes),
	}
	// A confirm loop waiting for room among unwritten marks must end with
	// the session, whichever side fails: hence gctx, not hard.
	g, gctx := errgroup.WithContext(hard)
	sessionAcks := newAcks(gctx, marks, r.marker)
	reader.Drained = sessionAcks.settled(gctx, drained)
	publisher := r.publisher(link, events, sessionAcks, drained)
	publisher.Budget = budget
	r.log.Info("streaming", "from", start, "status_interval", interval)
	r.alive.Store(time.Now().UnixNano())
	r.setRole(RoleStreaming)
	r.setDetail("")

	stopping, readerDone := markerStopping(r.marker), make(chan struct{})
	g.Go(func() error { defer close(readerDone); return reader.Run(gctx) })
	g.Go(func() error { return publisher.Run(gctx) })
	g.Go(func() error { return watchStopping(gctx, stopping, readerDone) })
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
		Log: r.log, Metrics: r.pubM, Refused: r.refused,
	}
}

// acks hands each confirm to the marker, and the marker's completion to
// the watermark: an event counts as done for the slot only once its row is
// marked (or parked, or gone). Without a marker the ack goes straight to
// the watermark. A late callback of an ended session only moves that
// session's own, discarded watermark: harmless.
type acks struct {
	ctx    context.Context //nolint:containedctx // the session's: Ack has no ctx parameter (publish.Acker), and a wait for room in the marker must end with the session
	marks  *slot.Watermark
	marker Marker
	open   *atomic.Int64      // events handed to the marker and not done yet
	count  prometheus.Counter // if set, counts every confirm (adoption progress)
}

func newAcks(ctx context.Context, marks *slot.Watermark, marker Marker) acks {
	return acks{ctx: ctx, marks: marks, marker: marker, open: new(atomic.Int64)}
}

func (a acks) Ack(seq uint64, id string) {
	a.hand(seq, func(done func()) error { return a.marker.Mark(a.ctx, id, done) })
}

// Parked moves the watermark past a poison event once it is recorded on
// its row (or recording proved impossible): never published as is.
func (a acks) Parked(seq uint64, id, reason string) {
	a.hand(seq, func(done func()) error { return a.marker.Park(a.ctx, id, reason, done) })
}

// hand gives event seq to the marker through give, whose done callback
// acks the watermark; without a marker the watermark is acked at once.
func (a acks) hand(seq uint64, give func(done func()) error) {
	if a.count != nil {
		a.count.Inc()
	}
	if a.marker == nil {
		a.marks.Ack(seq)
		return
	}
	a.open.Add(1)
	if give(a.done(seq)) != nil {
		a.open.Add(-1) // the session is ending; the slot stays before this event
	}
}

func (a acks) done(seq uint64) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			a.marks.Ack(seq)
			a.open.Add(-1)
		})
	}
}

// settled returns a channel closed once after is closed and every event
// handed to the marker is done (or ctx ends), asking the marker to write
// at once: the final status update of a graceful stop then includes the
// marks written during the drain.
func (a acks) settled(ctx context.Context, after <-chan struct{}) <-chan struct{} {
	if a.marker == nil {
		return after
	}
	out := make(chan struct{})
	go func() {
		select {
		case <-after:
		case <-ctx.Done():
			return // the reader sees ctx end by itself
		}
		a.wait(ctx)
		close(out)
	}()
	return out
}

// wait returns once every event handed to the marker is done, or ctx ends.
func (a acks) wait(ctx context.Context) {
	if a.marker == nil {
		return
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for a.open.Load() > 0 {
		a.marker.Flush()
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
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

// replicationParams are set on the replication connection unless the URL
// sets them.
var replicationParams = map[string]string{"statement_timeout": "0", "idle_in_transaction_session_timeout": "0"}

// connectReplication opens the replication connection.
func (r *Relay) connectReplication(ctx context.Context) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(r.cfg.DatabaseURL)
	if err != nil {
		return nil, errors.New("parse CDCRELAY_DATABASE_URL: not a valid connection string")
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = "cdcrelay"
	// A slot created with an exported snapshot leaves this connection in a
	// transaction until the backlog is published (adoption); slot creation
	// itself waits for every open transaction. A role's timeouts must end
	// neither: the relay reports what it waits for instead.
	for k, v := range replicationParams {
		if _, set := cfg.RuntimeParams[k]; !set {
			cfg.RuntimeParams[k] = v
		}
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeout
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		r.metrics.connectFailures.WithLabelValues("postgres").Inc()
		return nil, fmt.Errorf("open replication connection: %w", pgerr.Connect(err))
	}
	r.metrics.connectedTo("postgres")
	return conn, nil
}

// startOnce sends START_REPLICATION once (see startReplication); a slot
// active for another process is returned as the server's error.
func (r *Relay) startOnce(ctx context.Context, conn *pgconn.PgConn) error {
	err := pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			"publication_names " + slot.PublicationNamesArg(r.cfg.Publication),
		},
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55006" {
		return err
	}
	if err != nil {
		return fmt.Errorf("start replication on slot %s: %w", r.cfg.Slot, err)
	}
	return nil
}
