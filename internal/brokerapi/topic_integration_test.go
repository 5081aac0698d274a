package brokerapi

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationTopicMatchAgreesWithBroker holds TopicMatch to what a
// real topic exchange does: one queue per binding pattern, every key
// published once, and each queue must hold exactly the keys TopicMatch
// says its pattern takes. The patterns and keys are the edge cases:
// empty words, the empty key (no word to RabbitMQ), "#" at either end or
// twice, "*" against nothing.
func TestIntegrationTopicMatchAgreesWithBroker(t *testing.T) {
	node := testenv.MustRabbitMQ(t, testenv.RabbitMQOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, ch := testenv.MustChannel(t, node.URL())
	if err := ch.ExchangeDeclare("topics", amqp.ExchangeTopic, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	patterns := []string{"", "*", "#", "a", "a.*", "a.#", "#.a", "*.*", "a..b", "a.*.b", ".", "*.", ".*", "#.#", "a.#.b", "#.*", "*.#", "#.a.#", "a.#.#.b"}
	keys := []string{"", "a", "a.", ".a", ".", "..", "a.b", "a..b", "a.x.b", "a.x.y.b", "b", "x.a.y", "a.a"}
	for i, p := range patterns {
		q := fmt.Sprintf("topic-%d", i)
		// Exclusive: this channel's connection declares, fills and reads
		// every queue and lasts the test; RabbitMQ 4.3 refuses a transient
		// queue that is not exclusive.
		if _, err := ch.QueueDeclare(q, false, false, true, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q, p, "topics", false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "topics", k, false, false, amqp.Publishing{Body: []byte(k)})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publish %q: acked %v, %v", k, ok, err)
		}
	}
	for i, p := range patterns {
		got := map[string]bool{}
		for {
			d, ok, err := ch.Get(fmt.Sprintf("topic-%d", i), true)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			got[string(d.Body)] = true
		}
		for _, k := range keys {
			if want := TopicMatch(p, k); got[k] != want {
				t.Errorf("pattern %q, key %q: the broker routed it %v, TopicMatch says %v", p, k, got[k], want)
			}
		}
	}
}
