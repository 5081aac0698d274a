package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// barrierPrefix starts the message_id of the test's own barrier messages.
const barrierPrefix = "cdcrelay-test-barrier-"

// brokerBarrier publishes a barrier message to the test's exchange with
// routing key key (one the consumer's queue binds) and waits until the
// consumer has it, then returns what the consumer received from the relay.
// Call it once the relay has stopped publishing (stopped, exited, or
// down): whatever it published before reached the queue before the
// barrier did, so a "nothing more arrived" check made on the result is
// final, not a guess at how long a late delivery takes.
func (e *env) brokerBarrier(t *testing.T, key string) []testenv.Delivery {
	t.Helper()
	_, ch := testenv.MustChannel(t, e.amqpURL)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	id := barrierPrefix + testenv.UniqueName("b")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, e.exchange, key, true, false, amqp.Publishing{MessageId: id, Body: []byte("{}")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := conf.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("barrier message not confirmed (%v, %v)", ok, err)
	}
	relaytest.WaitDelivered(t, e.consumer, []string{id}, 30*time.Second, nil)
	return e.relayed()
}

// relayed is what the consumer received, without the test's barrier
// messages.
func (e *env) relayed() []testenv.Delivery {
	var out []testenv.Delivery
	for _, d := range e.consumer.Deliveries() {
		if !strings.HasPrefix(d.MessageID, barrierPrefix) {
			out = append(out, d)
		}
	}
	return out
}
