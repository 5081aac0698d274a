package inbox

import "time"

// This file is the lease claim's state machine as pure functions, apart
// from the SQL that applies it (effect.go), so it can be model-tested and
// fuzzed. A ledger row is absent, claimed (by an owner token until
// lease_until, or released by a failed handler: no owner) or done; done is
// final.

// ledgerRow is what the ledger holds for one (message_id, handler).
type ledgerRow struct {
	exists     bool
	done       bool
	owner      string // "" once the owner released the claim after a failure
	leaseUntil time.Time
	attempts   int
}

// action is what a delivery does after reading the row.
type action int

const (
	// actClaim: no row; insert a claim (attempt 1).
	actClaim action = iota
	// actRetry: the previous owner released the claim (its handler
	// failed); take it, attempt + 1.
	actRetry
	// actTakeOver: another owner's lease has expired (it crashed or lost
	// its database); take the claim over, attempt + 1.
	actTakeOver
	// actWait: another owner holds a live lease; look again later.
	actWait
	// actDuplicate: done; ack without running the handler.
	actDuplicate
)

func (a action) String() string {
	return [...]string{"claim", "retry", "take over", "wait", "duplicate"}[a]
}

// decide is the claim rule, at the database's time now. A lease that ends
// exactly now has expired.
func decide(r ledgerRow, now time.Time) action {
	switch {
	case !r.exists:
		return actClaim
	case r.done:
		return actDuplicate
	case r.owner == "":
		return actRetry
	case now.Before(r.leaseUntil):
		return actWait
	default:
		return actTakeOver
	}
}

// claimed is the row after owner took it with action a (one of actClaim,
// actRetry, actTakeOver) at now, for lease.
func claimed(r ledgerRow, a action, owner string, now time.Time, lease time.Duration) ledgerRow {
	attempts := 1
	if a != actClaim {
		attempts = r.attempts + 1
	}
	return ledgerRow{exists: true, owner: owner, leaseUntil: now.Add(lease), attempts: attempts}
}

// ownedBy reports whether owner may still act on the claim (renew, mark
// done, release): the conditioned UPDATEs' WHERE state = 'claimed' AND
// owner = $owner. An expired lease not yet taken over is still owned: its
// owner finishing late is better than nobody finishing.
func ownedBy(r ledgerRow, owner string) bool {
	return r.exists && !r.done && owner != "" && r.owner == owner
}

// completed is the row after its owner marked it done.
func completed(r ledgerRow) ledgerRow {
	r.done, r.owner, r.leaseUntil = true, "", time.Time{}
	return r
}

// released is the row after its owner gave it up (the handler failed), so
// the next delivery retries at once rather than after the lease.
func released(r ledgerRow) ledgerRow {
	r.owner, r.leaseUntil = "", time.Time{}
	return r
}
