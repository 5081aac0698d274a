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
// the relay learns the limit, sends the next such row alone so that the
// broker's refusal names it too, and the rows around them flow.
func TestIntegrationBrokerSizeLimitParked(t *testing.T) {
	_, e := sizeLimitedEnv(t)
	r := e.startRelay(map[string]string{"MAX_MESSAGE_BYTES": "4MiB", "MAX_IN_FLIGHT_BYTES": "16MiB"})
	r.waitStreaming(t)
	before, _ := insertTxns(t, e.db, "k.before", 1, 1)
	big := func() string { return insertBig(t, e) }
	first := big()
	middle, _ := insertTxns(t, e.db, "k.middle", 1, 1)
	second := big()
	after, last := insertTxns(t, e.db, "k.after", 1, 1)
	want := append(append(append([]row(nil), before...), middle...), after...)
	waitAll(t, e.consumer, want, 60*time.Second)
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	// Both refused by the broker itself: the learned limit sends the
	// second alone, so the 406 names it, rather than parking it unsent.
	checkParked(t, e, map[string]string{
		first:  "1048576",
		second: "1048576",
	})
	if got := gauge(t, r.reg, "cdcrelay_broker_max_message_bytes"); got != 1048576 {
		t.Fatalf("cdcrelay_broker_max_message_bytes = %v, want 1048576", got)
	}
}

// sizeLimitedEnv is an env whose broker is a private node with
// max_message_size 1 MiB.
func sizeLimitedEnv(t *testing.T) (*testenv.RabbitMQ, *env) {
	t.Helper()
	node, err := testenv.StartRabbitMQ(context.Background(), testenv.RabbitMQOptions{Config: map[string]string{"max_message_size": "1048576"}})
	if err != nil {
		t.Fatalf("private RabbitMQ node: %v", err)
	}
	t.Cleanup(func() { _ = node.Close() })
	return node, newEnvWith(t, testenv.PostgresOptions{}, node.URL(), "#")
}

// insertBig inserts a row of 1.5 MiB with routing key k.big and returns
// its id.
func insertBig(t *testing.T, e *env) string {
	t.Helper()
	var id string
	payload := fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", 1536*1024))
	if err := e.db.QueryRow(context.Background(), `INSERT INTO event_outbox (routing_key, payload) VALUES ('k.big', $1) RETURNING id::text`, payload).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestIntegrationBrokerSizeLimitRaised: the limit
// learned from a 406 is a belief about the broker, not a rule. After the
// operator raises max_message_size (and restarts the node, as the runbook
// says), a row above the old limit is delivered, not parked,
// and the learned limit is dropped. Before, the row was parked unsent
// (attempts 1, "above the broker's max_message_size (1048576)") until the
// relay restarted.
func TestIntegrationBrokerSizeLimitRaised(t *testing.T) {
	ctx := context.Background()
	node, e := sizeLimitedEnv(t)
	r := e.startRelay(map[string]string{"MAX_MESSAGE_BYTES": "4MiB", "MAX_IN_FLIGHT_BYTES": "16MiB", "BACKOFF_MIN": "100ms", "BACKOFF_MAX": "1s"})
	r.waitStreaming(t)
	big := func() string { return insertBig(t, e) }
	first := big()
	checkParked(t, e, map[string]string{first: "1048576"})
	if got := gauge(t, r.reg, "cdcrelay_broker_max_message_bytes"); got != 1048576 {
		t.Fatalf("cdcrelay_broker_max_message_bytes = %v after the refusal, want 1048576", got)
	}
	// The operator raises the limit in rabbitmq.conf and restarts the
	// node, which every version honours (RabbitMQ 4.3 keeps the limit it
	// booted with through application:set_env and close_all_connections;
	// 3.10 takes that too). The relay reconnects by itself.
	if err := node.Stop(ctx); err != nil {
		t.Fatalf("stop the broker: %v", err)
	}
	if err := node.SetConfig("max_message_size", "8388608"); err != nil {
		t.Fatal(err)
	}
	if err := node.Start(ctx); err != nil {
		t.Fatalf("start the broker: %v", err)
	}
	second := big()
	after, last := insertTxns(t, e.db, "k.after", 1)
	waitDeliveredIDs(t, e.consumer, []string{second, after[0].id}, 60*time.Second, nil)
	testenv.WaitConfirmed(t, e.db, slotName, last+1, 30*time.Second)
	var published bool
	var lastError *string
	if err := e.db.QueryRow(ctx, `SELECT published_at IS NOT NULL, last_error FROM event_outbox WHERE id = $1`, second).Scan(&published, &lastError); err != nil {
		t.Fatal(err)
	}
	if !published || lastError != nil {
		t.Fatalf("the row above the old limit: published %v, last_error %v; want published and no error", published, lastError)
	}
	if got := gauge(t, r.reg, "cdcrelay_broker_max_message_bytes"); got != 0 {
		t.Fatalf("cdcrelay_broker_max_message_bytes = %v after the broker accepted a larger message, want 0 (unknown)", got)
	}
}
