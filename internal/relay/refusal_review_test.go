//go:build faults

package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// Slow cases of docs/reliability.md, "When the broker refuses a message",
// run by make test-faults: the review's bounded-queue set-ups and a private
// broker node with a small max_message_size (about a minute to start).
//
// The review's own set-up (docs/reliability.md, "When the broker refuses a
// message"): a queue of x-max-length 200 with reject-publish, a consumer at
// 40 msg/s, the default window. Slow (about 80 s each), so it runs in make
// test-faults.

// TestIntegrationBoundedQueueReviewSetup: 3,000 one-row transactions.
func TestIntegrationBoundedQueueReviewSetup(t *testing.T) {
	boundedQueue{maxLen: 200, perMessage: 25 * time.Millisecond, singles: 3000, within: 150 * time.Second}.run(t)
}

// TestIntegrationBoundedQueueReviewOneTransaction: the 3,000 rows in one
// transaction, fifteen times the queue's room.
func TestIntegrationBoundedQueueReviewOneTransaction(t *testing.T) {
	boundedQueue{maxLen: 200, perMessage: 25 * time.Millisecond, big: 3000, within: 150 * time.Second}.run(t)
}

// TestIntegrationBrokerSizeLimitParked: a private node with a
// max_message_size below CDCRELAY_MAX_MESSAGE_BYTES closes the channel
// for a larger message (406). The row is parked with the broker's reason,
// the relay learns the limit, parks the next such row before sending it,
// and the rows around them flow.
func TestIntegrationBrokerSizeLimitParked(t *testing.T) {
	ctx := context.Background()
	node, err := testenv.StartRabbitMQ(ctx, testenv.RabbitMQOptions{Config: map[string]string{"max_message_size": "1048576"}})
	if err != nil {
		t.Fatalf("private RabbitMQ node: %v", err)
	}
	t.Cleanup(func() { _ = node.Close() })
	e := newEnvWith(t, testenv.PostgresOptions{}, node.URL(), "#")
	r := e.startRelay(map[string]string{"MAX_MESSAGE_BYTES": "4MiB", "MAX_IN_FLIGHT_BYTES": "16MiB"})
	r.waitStreaming(t)
	before, _ := insertTxns(t, e.db, "k.before", 1, 1)
	big := func() string {
		var id string
		payload := fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", 1536*1024))
		if err := e.db.QueryRow(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('k.big', $1) RETURNING id::text`, payload).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	first := big()
	middle, _ := insertTxns(t, e.db, "k.middle", 1, 1)
	second := big()
	after, last := insertTxns(t, e.db, "k.after", 1, 1)
	want := append(append(append([]row(nil), before...), middle...), after...)
	waitAll(t, e.consumer, want, 60*time.Second)
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	checkParked(t, e, map[string]string{
		first:  "1048576", // the 406's reason, or the limit learned from it
		second: "above the broker's max_message_size (1048576)",
	})
	if got := gauge(t, r.reg, "cdcrelay_broker_max_message_bytes"); got != 1048576 {
		t.Fatalf("cdcrelay_broker_max_message_bytes = %v, want 1048576", got)
	}
}
