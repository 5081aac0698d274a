package testenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestIntegrationReadStream: ReadStream returns what was published to a
// stream, in order, every time it is called (a stream is a log, reading
// removes nothing), and fails, saying how many it read, when fewer than
// asked for are there.
func TestIntegrationReadStream(t *testing.T) {
	t.Parallel()
	url := RequireAMQP(t)
	exchange, queue := UniqueName("cdcrelay_stream_x"), UniqueName("cdcrelay_stream")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := DeclareExchange(ctx, url, exchange); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = DeleteExchange(context.Background(), url, exchange) })
	MustStream(t, url, exchange, queue, "s.#")

	_, ch := MustChannel(t, url)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	const n = 5
	for i := range n {
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "s.k", true, false,
			amqp.Publishing{MessageId: fmt.Sprint("m", i), Body: []byte(fmt.Sprint(i)), DeliveryMode: amqp.Persistent})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publish %d: acked %v, %v", i, ok, err)
		}
	}
	for read := range 2 {
		got, err := ReadStream(ctx, url, queue, n, 300*time.Millisecond)
		if err != nil {
			t.Fatalf("read %d: %v", read, err)
		}
		if len(got) != n {
			t.Fatalf("read %d: %d messages, want %d", read, len(got), n)
		}
		for i, d := range got {
			if d.MessageID != fmt.Sprint("m", i) || string(d.Body) != fmt.Sprint(i) || d.RoutingKey != "s.k" {
				t.Fatalf("read %d, message %d: id %q body %q key %q", read, i, d.MessageID, d.Body, d.RoutingKey)
			}
			if _, ok := d.Headers["x-stream-offset"]; !ok {
				t.Errorf("read %d, message %d: no x-stream-offset header: %v", read, i, d.Headers)
			}
		}
	}
	// Long enough to dial and read the 5 on two cores busy with other
	// suites (1 s read none under RabbitMQ 4.x in CI).
	short, cancelShort := context.WithTimeout(ctx, 10*time.Second)
	defer cancelShort()
	got, err := ReadStream(short, url, queue, n+1, 200*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || len(got) != n {
		t.Fatalf("asking for %d of %d: %d read, error %v; want the %d and a deadline error", n+1, n, len(got), err, n)
	}
}
