package relay

import (
	"context"
	"errors"
)

// ErrDatabaseShuttingDown ends a streaming session whose marks the database
// refuses because it is shutting down. Retryable: the next session streams
// from the slot's confirmed position once the database is back.
var ErrDatabaseShuttingDown = errors.New("database is shutting down; ending the replication session so it can stop; unmarked events will be published again")

// watchDatabaseShutdown ends the session with ErrDatabaseShuttingDown when the janitor
// learns that the database is shutting down (janitor.DatabaseShuttingDown, taken before
// the session streams). A logical walsender exits
// only once its client has confirmed all the WAL sent to it, which the
// session withholds while acked rows are unmarked (invariant 10,
// docs/architecture.md): without this the server's shutdown would wait for
// the relay for as long as the session lives. The unmarked events are
// behind the slot's position, so the next session publishes them again.
// It returns nil once the reader has returned or ctx ends.
func watchDatabaseShutdown(ctx context.Context, dbShuttingDown <-chan struct{}, readerDone <-chan struct{}) error {
	select {
	case <-dbShuttingDown:
		return ErrDatabaseShuttingDown
	case <-readerDone:
	case <-ctx.Done():
	}
	return nil
}
