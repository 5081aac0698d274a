package testenv

import (
	"context"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestIntegrationRabbitMQPrivateNode starts a private node, checks that a durable queue
// and a persistent message survive a real stop and start, that the memory
// watermark blocks and unblocks publishers, and that Close leaves nothing
// behind. The machine's shared broker is not touched.
func TestIntegrationRabbitMQPrivateNode(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := MustRabbitMQ(t, RabbitMQOptions{})
	if r.Port() == 5672 || r.Node() == "rabbit@localhost" {
		t.Fatalf("private node collides with the shared broker: %s on %d", r.Node(), r.Port())
	}

	queue := UniqueName("cdcrelay_rmq_test")
	conn, ch := MustChannel(t, r.URL())
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: "m1", Body: []byte("kept")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("confirm: %v %v", ok, err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))

	// A real stop closes client connections and the port.
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("client connection still open after Stop")
	}
	if r.Running() {
		t.Fatal("Running after Stop")
	}
	cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
	if err := CheckAMQP(cctx, r.URL()); err == nil {
		t.Fatal("broker reachable after Stop")
	}
	ccancel()
	if _, err := r.Ctl(ctx, "status"); err == nil {
		t.Fatal("rabbitmqctl works on a stopped node")
	}

	// Start: same port, same data, the message is still there.
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	_, ch = MustChannel(t, r.URL())
	msg, ok, err := ch.Get(queue, true)
	if err != nil || !ok || string(msg.Body) != "kept" || msg.MessageId != "m1" {
		t.Fatalf("after restart: get %q ok=%v err=%v, want the persistent message", msg.Body, ok, err)
	}

	// The memory alarm blocks publishing connections (RabbitMQ tells a
	// connection once it publishes), and lifting it unblocks them.
	pconn, pch := MustChannel(t, r.URL())
	blocked := pconn.NotifyBlocked(make(chan amqp.Blocking, 4))
	if err := r.SetMemoryHighWatermark(ctx, 0); err != nil {
		t.Fatal(err)
	}
	// Lifted before the connections close if the test fails meanwhile.
	t.Cleanup(func() { _ = r.SetMemoryHighWatermark(context.Background(), 0.4) })
	if err := pch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: []byte("held")}); err != nil {
		t.Fatal(err)
	}
	waitBlocking(t, blocked, true)
	if err := r.SetMemoryHighWatermark(ctx, 0.4); err != nil {
		t.Fatal(err)
	}
	waitBlocking(t, blocked, false)

	// Close kills the node and removes its directory; a second Close is a
	// no-op.
	dir := r.Dir()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("node dir %s still there after Close: %v", dir, err)
	}
	if r.Running() {
		t.Fatal("Running after Close")
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := r.Start(ctx); err == nil {
		t.Fatal("Start after Close worked")
	}
}

// TestIntegrationRabbitMQKill: a crashed node can be started again.
func TestIntegrationRabbitMQKill(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := MustRabbitMQ(t, RabbitMQOptions{})
	r.Kill()
	if r.Running() {
		t.Fatal("Running after Kill")
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := CheckAMQP(ctx, r.URL()); err != nil {
		t.Fatal(err)
	}
}

// waitBlocking waits for a connection.blocked (active) or unblocked
// notification.
func waitBlocking(t *testing.T, ch <-chan amqp.Blocking, active bool) {
	t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case b := <-ch:
			if b.Active == active {
				return
			}
		case <-timeout:
			t.Fatalf("no connection.blocked notification with active=%v", active)
		}
	}
}
