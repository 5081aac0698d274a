package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/preflight"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// This file handles a slot held by a process that is not a relay
// (pg_recvlogical, a subscription, another tool). Such a process confirms
// the slot's position past events the relay then never streams, so it is
// an error, not a standby's wait: the relay logs it at ERROR, /readyz
// answers 503 with the holder, and cdcrelay_status says slot_foreign
// (alert CdcrelaySlotForeignHolder). A relay holding the slot (a relay of
// an older version outside the slot lock, one whose session is ending)
// stays what it was: a standby's wait.

// ForeignHolderError is a session's end on a slot held by a process that
// is not a relay: check's finding (preflight.ForeignHolder) and the
// holder. It wraps slot.ErrBusy: retried every CDCRELAY_STANDBY_RETRY,
// since the process may go.
type ForeignHolderError struct {
	Holder  slot.SlotHolder
	Finding preflight.Finding
	Err     error
}

func (e *ForeignHolderError) Error() string {
	return e.Finding.Message + " (remedy: " + e.Finding.Remedy + "): " + e.Err.Error()
}

func (e *ForeignHolderError) Unwrap() error { return e.Err }

// foreignReport is how often the relay repeats its ERROR while the same
// process holds the slot; a new holder is reported at once.
const foreignReport = time.Minute

// classifyBusy turns the error of a session that found the slot held
// outside the slot lock (busy, slot.ErrBusy) into a ForeignHolderError
// when the holder is not a relay. The session's connections are closed
// by then: the holder is read on one of its own. When it cannot be read,
// or has let go, busy is kept (a standby's wait, as before).
func (r *Relay) classifyBusy(ctx context.Context, busy error) error {
	if !errors.Is(busy, slot.ErrBusy) || ctx.Err() != nil {
		return busy
	}
	db, err := r.connectDB(ctx)
	if err != nil {
		return busy
	}
	defer pgconnect.Close(ctx, db)
	sdb, err := r.connectSlotDB(ctx, db)
	if err != nil {
		return busy
	}
	if sdb != db {
		defer pgconnect.Close(ctx, sdb)
	}
	h, held, err := slot.ReadHolder(ctx, sdb, r.cfg.Slot)
	if err != nil || !held || preflight.IsRelay(r.cfg, h) {
		return busy
	}
	return &ForeignHolderError{Holder: h, Finding: preflight.ForeignHolder(r.cfg.Slot, h), Err: busy}
}

// foreignHolder reports a slot held by a process that is not a relay: at
// ERROR when the holder changed or foreignReport passed, and in Status
// and Reason until a session streams or finds otherwise. The role is
// starting, not standby: /readyz is 503.
func (r *Relay) foreignHolder(fe *ForeignHolderError) {
	r.setRole(RoleStarting)
	key := fmt.Sprintf("%d/%s", fe.Holder.PID, fe.Holder.ApplicationName)
	if key != r.foreignNoted || time.Since(r.foreignLogged) >= foreignReport {
		r.foreignNoted, r.foreignLogged = key, time.Now()
		r.log.Error("replication slot is held by a process that is not a relay; retrying every CDCRELAY_STANDBY_RETRY",
			"holder_pid", fe.Holder.PID, "holder_application_name", fe.Holder.ApplicationName, "holder_client_addr", fe.Holder.ClientAddr,
			"problem", fe.Finding.Message, "remedy", fe.Finding.Remedy)
	}
	r.setDetail(ReasonSlotForeign, r.statusLine(fe.Finding.Message+"; "+fe.Finding.Remedy, 2*retryDetailMax))
}
