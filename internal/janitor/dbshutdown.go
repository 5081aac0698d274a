package janitor

import (
	"errors"
	"slices"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/pgerr"
)

// DatabaseShuttingDown returns a channel that is closed the next time a write fails
// because the database is shutting down. A logical walsender exits only
// once its client has confirmed all the WAL sent to it, and the relay
// withholds that while acked rows are unmarked (invariant 10,
// docs/architecture.md): the streaming session watches this channel and
// ends, so that the server's shutdown can complete. A caller gets the
// channel of failures still to come: one that happened before the call is
// not reported again (it concerned an earlier session; while the database
// stays down the next retry reports it anew).
func (j *Janitor) DatabaseShuttingDown() <-chan struct{} {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.dbShuttingDown
}

// databaseShuttingDown tells the current watchers that the database is shutting down
// and arms a fresh channel for later ones.
func (j *Janitor) databaseShuttingDown() {
	j.mu.Lock()
	defer j.mu.Unlock()
	close(j.dbShuttingDown)
	j.dbShuttingDown = make(chan struct{})
}

// shuttingDown reports whether err says that the database is shutting down
// or not running, so no mark can be written while the current replication
// session lives:
//   - 57P02 crash_shutdown: the server restarts after a backend crashed;
//   - 57P03 cannot_connect_now: the server is shutting down, starting up
//     or in recovery.
//
// 57P01 admin_shutdown (see terminated) is not enough by itself: a fast
// shutdown sends it, but so does a pg_terminate_backend of the janitor's
// connection alone. A refused connection, a reset or an EOF is not taken
// for a shutdown either: it may be a network fault, a proxy or a timeout
// on the janitor's path alone. When an open connection is lost the
// janitor connects again at once (writeOrLearn): a server that shuts down
// answers new connections with 57P03 until its walsenders are gone; a
// server that answers nothing has no walsender left to wait for.
// Permission errors (42501) and the like are not shutdowns: delivery goes
// on and the slot waits until marking works again.
func shuttingDown(err error) bool {
	return hasCode(err, pgerr.CrashShutdown, pgerr.CannotConnectNow)
}

// terminated reports whether err is 57P01 admin_shutdown: the janitor's
// backend was ended, by a fast or smart shutdown, a failover, or a
// pg_terminate_backend. Right after a lost connection, a new backend
// ended at once counts as a shutdown too.
func terminated(err error) bool {
	return hasCode(err, pgerr.AdminShutdown)
}

func hasCode(err error, codes ...string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && slices.Contains(codes, pgErr.Code)
}
