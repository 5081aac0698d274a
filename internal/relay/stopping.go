package relay

import (
	"context"
	"errors"
)

// ErrDatabaseStopping ends a streaming session whose marks the database
// refuses because it is shutting down. Retryable: the next session streams
// from the slot's confirmed position once the database is back.
var ErrDatabaseStopping = errors.New("database is shutting down; ending the replication session so it can stop; unmarked events will be published again")

// stopSignaler is an Outcomes recorder that learns when the database is shutting down
// (the janitor): Stopping returns a channel closed at the next such failure.
type stopSignaler interface {
	Stopping() <-chan struct{}
}

// outcomesStopping returns the recorder's shutdown signal, nil (never ready)
// if it has none. A session takes it before it streams.
func outcomesStopping(m Outcomes) <-chan struct{} {
	if s, ok := m.(stopSignaler); ok {
		return s.Stopping()
	}
	return nil
}

// watchStopping ends the session with ErrDatabaseStopping when the recorder
// learns that the database is shutting down. A logical walsender exits
// only once its client has confirmed all the WAL sent to it, which the
// session withholds while acked rows are unmarked (invariant 10,
// docs/reliability.md): without this the server's shutdown would wait for
// the relay for as long as the session lives. The unmarked events are
// behind the slot's position, so the next session publishes them again.
// It returns nil once the reader has returned or ctx ends.
func watchStopping(ctx context.Context, stopping <-chan struct{}, readerDone <-chan struct{}) error {
	select {
	case <-stopping:
		return ErrDatabaseStopping
	case <-readerDone:
	case <-ctx.Done():
	}
	return nil
}
