//go:build faults

package relay_test

import (
	"testing"
	"time"
)

// The review's own set-up (docs/reliability.md, "When the broker refuses a
// message"): a queue of x-max-length 200 with reject-publish, a consumer at
// 40 msg/s, the default window. Slow (about 80 s each), so it runs in make
// test-faults.

// TestFaultsBoundedQueueReviewSetup: 3,000 one-row transactions.
func TestFaultsBoundedQueueReviewSetup(t *testing.T) {
	boundedQueue{maxLen: 200, perMessage: 25 * time.Millisecond, singles: 3000, within: 150 * time.Second}.run(t)
}

// TestFaultsBoundedQueueReviewOneTransaction: the 3,000 rows in one
// transaction, fifteen times the queue's room.
func TestFaultsBoundedQueueReviewOneTransaction(t *testing.T) {
	boundedQueue{maxLen: 200, perMessage: 25 * time.Millisecond, big: 3000, within: 150 * time.Second}.run(t)
}
