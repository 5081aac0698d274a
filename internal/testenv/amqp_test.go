package testenv

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestIntegrationCheckAMQP(t *testing.T) {
	t.Parallel()
	url := RequireAMQP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := CheckAMQP(ctx, url); err != nil {
		t.Fatal(err)
	}

	// Port 1 on loopback has no listener: the error must name the address,
	// say how to start the broker and hide the password.
	err := CheckAMQP(ctx, "amqp://guest:s3cretpw@127.0.0.1:1/")
	if err == nil {
		t.Fatal("CheckAMQP succeeded against a closed port")
	}
	msg := err.Error()
	if !strings.Contains(msg, "RabbitMQ not reachable at 127.0.0.1:1") || !strings.Contains(msg, "rabbitmq-server -detached") {
		t.Errorf("unhelpful error: %s", msg)
	}
	if strings.Contains(msg, "s3cretpw") {
		t.Errorf("error leaks the password: %s", msg)
	}
}

func TestIntegrationConsumerReceives(t *testing.T) {
	t.Parallel()
	url := RequireAMQP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	exchange := UniqueName("testenv_ex")
	t.Cleanup(func() { _ = DeleteExchange(context.Background(), url, exchange) })
	c := MustConsumer(t, url, exchange, UniqueName("testenv_q"), "orders.#")

	ts := time.Now().Truncate(time.Second)
	publish(ctx, t, url, exchange, "orders.created", amqp.Publishing{
		MessageId:    "m-1",
		Type:         "OrderCreated",
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		Timestamp:    ts,
		Headers:      amqp.Table{"x-lsn": "0/16B3748"},
		Body:         []byte(`{"order_id":1}`),
	})
	// Not matched by the binding: must not arrive.
	publish(ctx, t, url, exchange, "users.created", amqp.Publishing{MessageId: "m-x", Body: []byte("{}")})
	publish(ctx, t, url, exchange, "orders.paid", amqp.Publishing{MessageId: "m-2", Body: []byte("{}")})

	if err := c.WaitCount(ctx, 2); err != nil {
		t.Fatal(err)
	}
	ds := c.Deliveries()
	d := ds[0]
	if d.MessageID != "m-1" || d.Exchange != exchange || d.RoutingKey != "orders.created" ||
		d.Type != "OrderCreated" || d.ContentType != "application/json" ||
		string(d.Body) != `{"order_id":1}` || d.Headers["x-lsn"] != "0/16B3748" ||
		!d.Timestamp.Equal(ts) || d.DeliveryMode != amqp.Persistent || d.Redelivered || d.ReceivedAt.IsZero() {
		t.Errorf("first delivery = %+v", d)
	}
	if ds[1].MessageID != "m-2" {
		t.Errorf("second delivery = %q, want m-2 (arrival order)", ds[1].MessageID)
	}
	if rest := c.DeliveriesFrom(1); len(rest) != 1 || rest[0].MessageID != "m-2" {
		t.Errorf("DeliveriesFrom(1) = %+v", rest)
	}
	if rest := c.DeliveriesFrom(5); len(rest) != 0 {
		t.Errorf("DeliveriesFrom(5) = %+v, want none", rest)
	}
	time.Sleep(100 * time.Millisecond)
	if n := c.Count(); n != 2 {
		t.Errorf("Count = %d, want 2 (users.created must not match orders.#)", n)
	}

	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if err := c.WaitCount(short, 3); err == nil || !strings.Contains(err.Error(), "2 of 3") {
		t.Errorf("WaitCount(3) = %v, want a timeout saying 2 of 3 arrived", err)
	}
}

// The consumer must come back by itself when its connection dies (as when
// the broker restarts); the durable queue keeps what arrives meanwhile.
func TestIntegrationConsumerReconnects(t *testing.T) {
	t.Parallel()
	url := RequireAMQP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	uri, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := MustProxy(t, AMQPAddr())
	viaProxy := uri
	viaProxy.Host, viaProxy.Port = "127.0.0.1", proxyPort(t, proxy)

	exchange := UniqueName("testenv_ex")
	t.Cleanup(func() { _ = DeleteExchange(context.Background(), url, exchange) })
	c := MustConsumer(t, viaProxy.String(), exchange, UniqueName("testenv_q"), "#")

	publish(ctx, t, url, exchange, "k", amqp.Publishing{MessageId: "before", Body: []byte("1")})
	if err := c.WaitCount(ctx, 1); err != nil {
		t.Fatal(err)
	}
	proxy.Reset()
	publish(ctx, t, url, exchange, "k", amqp.Publishing{MessageId: "after", Body: []byte("2")})
	// "before" may show up again (Redelivered) if its ack was lost in the
	// reset, so wait for "after" rather than for a count.
	err = c.WaitFor(ctx, func(ds []Delivery) bool {
		return slices.ContainsFunc(ds, func(d Delivery) bool { return d.MessageID == "after" })
	})
	if err != nil {
		t.Fatalf("%v; got %+v", err, c.Deliveries())
	}
	if c.Reconnects() < 1 {
		t.Errorf("Reconnects = %d after a reset", c.Reconnects())
	}
	for _, d := range c.Deliveries()[1:] {
		if d.MessageID == "before" && !d.Redelivered {
			t.Errorf("a second copy of %q without the Redelivered flag", d.MessageID)
		}
	}
}

func publish(ctx context.Context, t *testing.T, url, exchange, key string, msg amqp.Publishing) {
	t.Helper()
	_, ch := MustChannel(t, url)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, msg)
	if err != nil {
		t.Fatalf("publish %s: %v", key, err)
	}
	if ok, err := conf.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("publish %s: not confirmed (ack=%v, err=%v)", key, ok, err)
	}
}

func proxyPort(t *testing.T, p *Proxy) int {
	t.Helper()
	_, port, err := net.SplitHostPort(p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
