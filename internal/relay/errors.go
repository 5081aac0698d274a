package relay

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/wal"

	"github.com/cdcrelay/cdcrelay/internal/pgerr"
)

// IsFatal is the one place that decides whether a session error is worth a
// retry. Transport failures (either side), nacks, returns and timeouts are
// retried forever with backoff; errors that a retry would only repeat end
// the process with a non-zero exit so the operator sees them.
func IsFatal(err error) bool {
	if err == nil {
		return false
	}
	for _, e := range []error{wal.ErrUnsupported, wal.ErrProtocol, wal.ErrSchema, wal.ErrMalformed, slot.ErrSlotMismatch, slot.ErrSlotLost, slot.ErrFailoverUnsupported, slot.ErrSlotServer, slot.ErrPublication, publish.ErrPoison} {
		if errors.Is(err, e) {
			return true
		}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case pgerr.InvalidPassword, pgerr.InvalidAuthorizationSpec:
			return true
		}
	}
	return false
}
