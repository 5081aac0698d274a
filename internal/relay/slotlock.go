package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// lockConnParams are set on the connection that holds the slot lock unless
// the URL sets them. The keepalives make the server notice within about 25 s
// a holder whose host vanished without closing its sockets, instead of the
// operating system's two hours, so the standby's wait ends then.
var lockConnParams = map[string]string{
	"application_name":        "cdcrelay",
	"tcp_keepalives_idle":     "10",
	"tcp_keepalives_interval": "5",
	"tcp_keepalives_count":    "3",
}

// connectionCheckInterval makes a backend blocked in pg_advisory_lock look
// at its socket now and then (PostgreSQL 14+), so a standby that dies while
// waiting leaves the lock queue within seconds. It sends nothing.
const connectionCheckInterval = "5s"

// connectLock opens the normal connection that holds the slot lock for the
// whole session: a standby waits for the lock on it, and the owner runs the
// slot's lifecycle statements and the backfill on it.
func (r *Relay) connectLock(ctx context.Context) (*pgx.Conn, error) {
	dbCfg, err := pgx.ParseConfig(r.cfg.DatabaseURL)
	if err != nil {
		return nil, errors.New("parse CDCRELAY_DATABASE_URL: not a valid connection string")
	}
	if dbCfg.ConnectTimeout == 0 {
		dbCfg.ConnectTimeout = connectTimeout
	}
	for k, v := range lockConnParams {
		if _, set := dbCfg.RuntimeParams[k]; !set {
			dbCfg.RuntimeParams[k] = v
		}
	}
	db, err := pgx.ConnectConfig(ctx, dbCfg)
	if err != nil {
		r.metrics.connectFailures.WithLabelValues("postgres").Inc()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	if serverMajor(db.PgConn()) >= 14 {
		if _, err := db.Exec(ctx, "SET client_connection_check_interval = '"+connectionCheckInterval+"'"); err != nil {
			_ = db.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("set client_connection_check_interval: %w", err)
		}
	}
	return db, nil
}

// serverMajor is the server's major version (15 for "15.4"), 0 if unknown.
func serverMajor(c *pgconn.PgConn) int {
	v := c.ParameterStatus("server_version")
	major, _, _ := strings.Cut(v, ".")
	n, _ := strconv.Atoi(strings.TrimFunc(major, func(r rune) bool { return r < '0' || r > '9' }))
	return n
}

// acquire takes the slot lock on db. While another relay holds it, this
// one is the hot standby: it waits in one blocking statement, sending
// nothing and opening nothing, and goes on the moment the holder's session
// ends (invariant 8, docs/reliability.md).
func (r *Relay) acquire(ctx context.Context, db *pgx.Conn) error {
	ok, err := slot.TryLock(ctx, db, r.cfg.Slot)
	if err != nil || ok {
		return err
	}
	r.setRole(RoleStandby)
	attrs := []any{"lock", fmt.Sprintf("pg_locks: locktype=advisory classid=%d objid=hashtext('%s') objsubid=2", slot.LockClass, r.cfg.Slot)}
	if h, found, err := slot.LockHolder(ctx, db, r.cfg.Slot); err == nil && found {
		attrs = append(attrs, "holder_pid", h.PID, "holder_application_name", h.ApplicationName, "holder_client_addr", h.ClientAddr)
	}
	r.log.Info("slot is held by another relay; waiting as hot standby", attrs...)
	began := time.Now()
	if err := slot.WaitLock(ctx, db, r.cfg.Slot); err != nil {
		return err
	}
	r.setRole(RoleStarting)
	r.log.Info("took the slot lock; taking over the slot", "waited", time.Since(began).Round(time.Millisecond))
	return nil
}

// fence watches the slot lock's connection while the session streams. The
// owner runs no statement on it then, so the only thing that can arrive is
// its end: the backend was terminated, or the link broke. The relay then no
// longer holds the slot lock and another relay may be taking over, so the
// session stops at once: closing the replication socket ends the reader,
// and with it the publisher, without waiting for anything. The watch is a
// blocked read on the socket: no statement, no timer.
type fence struct {
	conn     *pgx.Conn
	stopping atomic.Bool
	lost     chan struct{} // closed once the lock's connection ended under the session
	cause    error         // why; written before lost is closed
	done     chan struct{}
}

func (r *Relay) startFence(db *pgx.Conn, repl *pgconn.PgConn) *fence {
	f := &fence{conn: db, lost: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		err := db.PgConn().WaitForNotification(context.Background())
		if f.stopping.Load() {
			return
		}
		if err == nil {
			err = errors.New("unexpected notification on the slot lock's connection")
		}
		f.cause = err
		close(f.lost)
		r.log.Error("lost the slot lock (its connection ended); stopping streaming at once", "error", err)
		_ = repl.Conn().Close()
	}()
	return f
}

// stop ends the watch by closing the lock's socket (which releases the
// lock); the caller closes db afterwards. Only the fence's goroutine uses
// db's protocol state until done is closed.
func (f *fence) stop() {
	f.stopping.Store(true)
	_ = f.conn.PgConn().Conn().Close()
	<-f.done
}

// explain names the lost lock as the cause of a session error.
func (f *fence) explain(err error) error {
	select {
	case <-f.lost:
		return fmt.Errorf("lost the slot lock: %w; stopped streaming (%v)", f.cause, err)
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
		if !errors.As(err, &pgErr) || pgErr.Code != "55006" { // active for another PID
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
