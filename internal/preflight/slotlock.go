package preflight

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// checkSlotLock is the connection to CDCRELAY_LOCK_DATABASE, where relays
// hold and wait for the slot lock, and who holds it now.
const checkSlotLock = "slot_lock"

// slotLock connects to the lock's database as the relay does and reports
// the lock's holder, if any.
func slotLock(ctx context.Context, cfg config.Config, opts Options) Finding {
	o := checkSession(opts, nil) // no statement_timeout: 2*opts.Timeout bounds this check
	o.Database = cfg.LockDatabase
	ctx, cancel := context.WithTimeout(ctx, 2*opts.Timeout)
	defer cancel()
	db, err := pgconnect.Connect(ctx, cfg.DatabaseURL, "to the lock's database", o)
	if errors.Is(err, pgconnect.ErrParse) {
		return Finding{Check: checkSlotLock, Severity: Error, Message: "CDCRELAY_DATABASE_URL is not a valid PostgreSQL connection string"}
	}
	if err != nil {
		f := connectFailed(checkSlotLock, "database "+cfg.LockDatabase, err)
		f.Remedy = fmt.Sprintf("the relay holds the slot lock in CDCRELAY_LOCK_DATABASE (%s): let the role connect to it (GRANT CONNECT ON DATABASE %s), or set CDCRELAY_LOCK_DATABASE to a database it can connect to; the service database works, but a waiting standby then holds back its vacuum horizon. (%s)",
			cfg.LockDatabase, cfg.LockDatabase, f.Remedy)
		return f
	}
	defer func() { _ = db.Close(context.WithoutCancel(ctx)) }()
	h, held, err := slot.LockHolder(ctx, db, cfg.Slot)
	if err != nil {
		return failed(checkSlotLock, "read the slot lock's holder from pg_locks", err)
	}
	if !held {
		return Finding{Check: checkSlotLock, Message: fmt.Sprintf("database %s reachable for the slot lock; no relay holds it", cfg.LockDatabase)}
	}
	since := ""
	if !h.Since.IsZero() {
		since = fmt.Sprintf(", connected %s ago", time.Since(h.Since).Round(time.Second))
	}
	return Finding{Check: checkSlotLock, Message: fmt.Sprintf("database %s reachable for the slot lock; held by pid %d (application_name %q, client %s%s)",
		cfg.LockDatabase, h.PID, h.ApplicationName, h.ClientAddr, since)}
}

// slotLockCheck reports the slot lock's database and holder.
func slotLockCheck(ctx context.Context, s *session) []Finding {
	return []Finding{slotLock(ctx, s.cfg, s.opts)}
}
