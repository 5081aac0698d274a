package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/backoff"
	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/janitor"
	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// eventBuffer is how many decoded events may wait between the reader and
// the publisher; the in-flight window sits behind it. Their bytes count
// against the session's byte budget with those in flight (budget).
const eventBuffer = 256

// marksHealth is what the status reads of the janitor: since when writing
// the marks has failed (or waited for a standby), and why; a zero time
// while they succeed. Narrow so the status is tested without a database.
type marksHealth interface {
	Failing() (since time.Time, err error)
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
// confirmed position; a failure discards the whole session (invariant 3,
// docs/architecture.md).
type Relay struct {
	cfg     config.Config
	outbox  config.Outbox
	mapping wal.Mapping // outbox, with what the session start learns of the table
	poison  publish.PoisonPolicy
	// janitor records every acknowledged or parked event on its row; a
	// session's watermark learns of the event only then (invariant 10, docs/architecture.md).
	janitor *janitor.Janitor
	marks   marksHealth // the janitor, as the status sees it
	log     *slog.Logger
	metrics *metrics
	walM    *wal.Metrics
	pubM    *publish.Metrics
	// refused outlives sessions: events the client library could not
	// encode, parked by the next session instead of published again.
	refused *publish.Refusals
	// carryover outlives sessions too: where the last one left off inside the
	// stream, so a broker that refuses some messages never makes the relay
	// publish the same acknowledged events session after session.
	carryover  *publish.Carryover
	unroutable publish.UnroutablePolicy
	// unknown outlives sessions too: relations whose insert ended a
	// session as unknown (wal.RelationUnknownError), OID to name. The next
	// session start classifies them from the catalog even when the
	// publication no longer lists them, since their inserts may still lie
	// ahead in the slot (unknown.go).
	unknown map[uint32]string
	// unfinished is the adoption this process began and did not finish
	// (adopt.go): its slot is kept, and the next session publishes the rest
	// of its backlog with indices past those already given. A relay that
	// finds an unfinished adoption it has no memory of (its process died)
	// creates the slot again. Run goroutine only.
	unfinished unfinishedAdoption
	// made is the slot this process created and never streamed from: a
	// fatal exit drops it (madeslot.go). Run goroutine only.
	made madeSlot
	// foreignNoted is the holder (pid/application_name) of the last slot
	// held by a process that is not a relay, foreignLogged when it was
	// last reported (slotholder.go). Run goroutine only.
	foreignNoted  string
	foreignLogged time.Time
	// system is the database system and timeline the last session's
	// replication connection reached (noteSystem); Run goroutine only.
	system slot.System
	// skipOrigins: this session's stream asks for origin 'none'
	// (origin.go); originsNoted, the foreign origins last warned about.
	// Run goroutine only. originMemo: what foreign origins seen earlier
	// still require (origin.go; its own rules for goroutines).
	skipOrigins  bool
	originsNoted string
	originMemo   originMemory

	role     atomic.Int32
	inFlight atomic.Pointer[meteredBudget] // the newest session's byte budget
	alive    atomic.Int64                  // unix nanos of the reader's last turn (touch)
	detail   atomic.Pointer[detail]        // what the relay waits for beyond its role (Status, Reason)
	lockPID  atomic.Uint32                 // backend pid of the last session's slot lock connection
	broker   brokerNodes                   // the node the next session dials first (connect.go)
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

// newRelay builds a relay from a validated configuration; jan records
// the fate of every acknowledged or parked event on its row (NewService).
// A nil log discards; a nil reg registers the metrics nowhere.
func newRelay(cfg config.Config, jan *janitor.Janitor, log *slog.Logger, reg prometheus.Registerer) (*Relay, error) {
	outbox, err := cfg.Outbox()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	registerLimits(reg, int64(cfg.MaxInFlight), int64(cfg.MaxInFlightBytes))
	r := &Relay{
		cfg:     cfg,
		outbox:  outbox,
		mapping: wal.Mapping{Outbox: outbox, MaxMessageBytes: int64(cfg.MaxMessageBytes)},
		poison:  map[string]publish.PoisonPolicy{config.PoisonPark: publish.Park, config.PoisonStop: publish.Stop}[cfg.Poison],
		janitor: jan, marks: jan,
		log:       log,
		metrics:   newMetrics(reg, cfg.Slot),
		walM:      wal.NewMetrics(reg, cfg.Slot),
		pubM:      publish.NewMetrics(reg, cfg.Slot),
		refused:   &publish.Refusals{},
		carryover: &publish.Carryover{},
		unknown:   make(map[uint32]string),
		unroutable: map[string]publish.UnroutablePolicy{
			config.UnroutableStall: publish.StallUnroutable, config.UnroutablePark: publish.ParkUnroutable,
		}[cfg.Unroutable],
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cdcrelay_in_flight_bytes",
		Help: "Bytes of the byte budget (CDCRELAY_MAX_IN_FLIGHT_BYTES) taken now: events decoded, or read from a snapshot, whose confirm or park is not yet handled."}, r.inFlightBytes))
	registerStatus(reg, cfg.Slot, r)
	return r, nil
}

// touch records a turn of the reader's loop (wal.ReaderConfig.Turned).
func (r *Relay) touch() { r.alive.Store(time.Now().UnixNano()) }

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
	delay := r.cfg.BackoffMin
	for {
		started, progress := time.Now(), r.carryover.Progress()
		err := r.session(ctx)
		if ctx.Err() != nil {
			if err != nil && !errors.Is(err, context.Canceled) {
				r.log.Warn("stopped with unconfirmed events; they will be published again on the next start", "error", err)
			}
			return nil
		}
		if IsFatal(err) {
			return err
		}
		r.rememberUnknown(err)
		wait := r.cfg.StandbyRetry
		var foreign *ForeignHolderError
		switch {
		case errors.As(err, &foreign):
			r.foreignHolder(foreign)
		case errors.Is(err, slot.ErrBusy):
			// A relay of this version waits for the slot lock in session;
			// this is a slot held outside it, which can only be retried.
			if r.Role() != RoleStandby {
				r.log.Info("slot is held by a relay outside the slot lock; retrying every CDCRELAY_STANDBY_RETRY", "detail", err)
			}
			r.setRole(RoleStandby)
			r.clearDetail() // what an earlier session reported (a foreign holder) is stale
		default:
			r.setRole(RoleStarting)
			// A session that ran for a while was healthy, and one that got
			// events through made progress (a bounded queue refusing the
			// rest): start the backoff over.
			if time.Since(started) > r.cfg.BackoffMax || r.carryover.Progress() != progress {
				delay = r.cfg.BackoffMin
			}
			wait = backoff.Jitter(delay)
			delay = backoff.Next(delay, r.cfg.BackoffMin, r.cfg.BackoffMax)
			r.metrics.restarts.Inc()
			var op *OperatorError
			if errors.As(err, &op) {
				r.log.Error(op.waitMessage(wait), "remedy", op.Remedy, "error", err)
			} else {
				r.log.Error("pipeline failed; restarting both sides from the slot", "error", err, "retry_in", wait.Round(time.Millisecond))
			}
			r.setDetail(r.retryDetail(err)) // /readyz and cdcrelay_status say why until the next session streams
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil
		}
	}
}
