package relay

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/pgerr"
	"github.com/cdcrelay/cdcrelay/internal/slot"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
)

// connectLock opens the connection that holds the slot lock for the whole
// session, to CDCRELAY_LOCK_DATABASE: a standby waits for the lock on it.
// The waiting statement holds a snapshot, so its xmin would hold back
// vacuum in the database it runs in for as long as it waits; in another
// database (postgres by default) it holds back nothing of the service
// database's (advisory locks are per database, slot names per cluster).
func (r *Relay) connectLock(ctx context.Context) (*pgx.Conn, error) {
	role := fmt.Sprintf("to the slot lock's database %s (CDCRELAY_LOCK_DATABASE)", r.cfg.LockDatabase)
	db, err := pgconnect.Connect(ctx, r.cfg.DatabaseURL, role, pgconnect.Options{Database: r.cfg.LockDatabase, LockHolder: true})
	if err != nil {
		r.metrics.connectFailures.WithLabelValues("postgres").Inc()
		return nil, err
	}
	return db, nil
}

// acquire takes the slot lock on db. While another relay holds it, this
// one is the hot standby: it waits in one blocking statement, sending
// nothing and opening nothing, and goes on the moment the holder's session
// ends (invariant 8, docs/architecture.md).
func (r *Relay) acquire(ctx context.Context, db *pgx.Conn) error {
	previous := r.lockPID.Swap(db.PgConn().PID())
	ok, err := slot.TryLock(ctx, db, r.cfg.Slot)
	if err != nil || ok {
		return err
	}
	attrs := []any{"lock", fmt.Sprintf("pg_locks: locktype=advisory classid=%d objid=hashtext('%s') objsubid=2", slot.LockClass, r.cfg.Slot)}
	h, found, err := slot.LockHolder(ctx, db, r.cfg.Slot)
	if err == nil && found {
		attrs = append(attrs, "holder_pid", h.PID, "holder_application_name", h.ApplicationName, "holder_client_addr", h.ClientAddr)
	}
	if found && uint32(h.PID) == previous {
		// This relay's last session ended a moment ago and its backend is
		// still on its way out (or, behind a broken link, until keepalives
		// end it): not a standby, just waiting for its own lock to go.
		r.log.Info("waiting for the slot lock of this relay's previous session to be released", attrs...)
	} else {
		r.setRole(RoleStandby)
		// A failed session's retry detail is stale now: this relay is a
		// healthy standby, and /readyz and cdcrelay_status say so.
		r.clearDetail()
		r.log.Info("slot is held by another relay; waiting as hot standby", attrs...)
	}
	began := time.Now()
	if err := slot.WaitLock(ctx, db, r.cfg.Slot); err != nil {
		return err
	}
	r.setRole(RoleStarting)
	r.log.Info("took the slot lock; taking over the slot", "waited", time.Since(began).Round(time.Millisecond))
	return nil
}

// fence watches the slot lock's connection for the whole session after
// the lock is taken. Nothing runs on it then, so the only thing that can
// arrive is its end: the backend was terminated, or the link broke. The
// relay no longer holds the slot lock and another relay may be taking
// over, so the session stops at once: cancel ends its work and lost
// contexts (lost is the pipeline's hard stop, also during a drain) and
// the replication socket is closed, which ends the reader, and with it the
// publisher, without waiting for anything. The watch is a blocked read on
// the socket: no statement, no timer.
type fence struct {
	conn     *pgx.Conn
	cancel   context.CancelFunc
	repl     atomic.Pointer[pgconn.PgConn]
	stopping atomic.Bool
	lost     chan struct{} // closed once the lock's connection ended under the session
	cause    error         // why; written before lost is closed
	done     chan struct{}
}

func (r *Relay) startFence(lock *pgx.Conn, cancel context.CancelFunc) *fence {
	f := &fence{conn: lock, cancel: cancel, lost: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		err := lock.PgConn().WaitForNotification(context.Background())
		if f.stopping.Load() {
			return
		}
		if err == nil {
			err = errors.New("unexpected notification on the slot lock's connection")
		}
		f.cause = err
		close(f.lost)
		r.log.Error("lost the slot lock (its connection ended); stopping at once", "error", err)
		cancel()
		if repl := f.repl.Load(); repl != nil {
			_ = repl.Conn().Close()
		}
	}()
	return f
}

// guard has the fence close repl's socket when the lock is lost, at once
// if it already is.
func (f *fence) guard(repl *pgconn.PgConn) {
	f.repl.Store(repl)
	select {
	case <-f.lost:
		_ = repl.Conn().Close()
	default:
	}
}

// stop ends the watch by closing the lock's socket (which releases the
// lock); the caller closes the connection afterwards. Only the fence's
// goroutine uses the connection's protocol state until done is closed.
func (f *fence) stop() {
	f.stopping.Store(true)
	_ = f.conn.PgConn().Conn().Close()
	<-f.done
}

// explain names the lost lock as the cause of a session error.
func (f *fence) explain(err error) error {
	select {
	case <-f.lost:
		// Only the lost lock classifies the error (retryable): err is its
		// consequence and is kept as text.
		return fmt.Errorf("lost the slot lock: %w; stopped (%v)", f.cause, err) //nolint:errorlint // see above
	default:
		return err
	}
}

// takeoverGrace is how long the slot may stay active for another process
// after this relay took the slot lock: a dead holder's walsender exits a
// moment after its socket closes, and PostgreSQL releases the slot then.
// Past it, the slot is held by a process outside the slot lock (a relay of
// an older version, or another client), which is retried every
// CDCRELAY_STANDBY_RETRY.
const takeoverGrace = 5 * time.Second

// takeoverStep is the pause between START_REPLICATION attempts meanwhile.
const takeoverStep = 25 * time.Millisecond

// startReplication streams from the slot's confirmed position: start LSN 0
// lets the server choose it; the relay never picks a position of its own.
func (r *Relay) startReplication(ctx context.Context, conn *pgconn.PgConn) error {
	deadline := time.Now().Add(takeoverGrace)
	for attempt := 1; ; attempt++ {
		err := r.startOnce(ctx, conn)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != pgerr.ObjectInUse { // active for another PID
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s although this relay holds the slot lock: a process outside it (a relay of an older version, or another client) streams the slot", slot.ErrBusy, pgErr.Message)
		}
		if attempt == 1 {
			r.log.Info("slot still active for the previous holder's walsender; retrying until PostgreSQL releases it", "detail", pgErr.Message)
		}
		select {
		case <-time.After(takeoverStep):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
