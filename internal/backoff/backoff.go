// Package backoff paces the retries of a failing stage: the relay's
// sessions and the janitor's writes. The wait doubles after each failure
// in a row up to a cap (Next), and each wait is drawn at random from its
// upper half (Jitter).
package backoff

import (
	"math/rand/v2"
	"time"
)

// Next doubles the wait after each failure in a row, from lo up to hi.
func Next(prev, lo, hi time.Duration) time.Duration {
	return min(max(2*prev, lo), hi)
}

// Jitter spreads the retries of many relays over [d/2, d]. The relay's
// sessions used ±20% and the janitor this; this one is kept for both
// because it never waits longer than d, so the cap (CDCRELAY_BACKOFF_MAX,
// the janitor's 5 s) is a true bound on every wait, and because it spreads
// relays that failed at the same moment (a PostgreSQL or broker restart
// seen by every relay of an estate) over a window of d/2 rather than 0.4d.
func Jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}
