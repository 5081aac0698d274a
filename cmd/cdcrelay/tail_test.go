package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

func TestFormatDelivery(t *testing.T) {
	d := amqp.Delivery{RoutingKey: "orders.created", MessageId: "7f2c", Type: "OrderCreated", ContentType: "application/json",
		Timestamp: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC),
		Headers:   amqp.Table{"cdcrelay-tx-index": int64(0), "cdcrelay-commit-lsn": "0/1A2B3C"}, Body: []byte(`{"order_id":42}`)}
	want := "routing_key=orders.created message_id=7f2c type=OrderCreated timestamp=2026-12-01T12:00:00Z content_type=application/json\n" +
		"headers: cdcrelay-commit-lsn=0/1A2B3C cdcrelay-tx-index=0\n" + `{"order_id":42}` + "\n\n"
	if got := formatDelivery(d); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if got := formatDelivery(amqp.Delivery{RoutingKey: "k", Body: []byte{0xff, 0xfe}}); got != "routing_key=k message_id=-\n(2 bytes, not UTF-8)\n\n" {
		t.Errorf("binary body: %q", got)
	}
}

// TestIntegrationTail: cdcrelay tail -route binds its own queue with the
// binding key, prints the messages it matches with their properties,
// headers and bodies, and exits after -n of them. It needs no management
// API, and says that it is a route of its own.
func TestIntegrationTail(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{}) // the relay's configuration names a database
	exchange := testenv.UniqueName("cdcrelay.tail")
	if err := testenv.DeclareExchange(ctx, amqpURL, exchange); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.DeleteExchange(context.Background(), amqpURL, exchange) })
	p := testenv.StartProcess(t, builds.Relay(t, true, ""), relayEnviron(pg, amqpURL, exchange), "tail", "-route", "-n", "2", "-timeout", "30s", "orders.#")
	for !strings.Contains(p.Log.String(), "waiting for messages") {
		if exited, err := p.Exited(); exited {
			t.Fatalf("tail exited (%v):\n%s", err, p.Log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct{ key, id, body string }{
		{"billing.paid", "b-1", `{"n":0}`}, {"orders.created", "o-1", `{"n":1}`}, {"orders.shipped", "o-2", `{"n":2}`},
	} {
		err := ch.PublishWithContext(ctx, exchange, m.key, false, false, amqp.Publishing{MessageId: m.id, Type: "Test",
			Headers: amqp.Table{"cdcrelay-tx-index": int64(0)}, Body: []byte(m.body)})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Wait(t, 30*time.Second); err != nil {
		t.Fatalf("tail: %v\n%s", err, p.Log.String())
	}
	out := p.Log.String()
	for _, want := range []string{
		"routing_key=orders.created message_id=o-1 type=Test\nheaders: cdcrelay-tx-index=0\n{\"n\":1}\n",
		"routing_key=orders.shipped message_id=o-2 type=Test\nheaders: cdcrelay-tx-index=0\n{\"n\":2}\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("tail's output lacks\n%s\nin\n%s", want, out)
		}
	}
	if strings.Contains(out, "billing.paid") {
		t.Errorf("tail printed a message its binding key does not match:\n%s", out)
	}
	if !strings.Contains(out, "tail is a route of its own (-route)") {
		t.Errorf("tail -route did not say that it is a route of its own:\n%s", out)
	}
}

// TestTailWithoutManagementURL: without -route, tail needs the management
// API to copy the bindings, and says so (and names -route) before it
// connects to anything.
func TestTailWithoutManagementURL(t *testing.T) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "CDCRELAY_") {
			t.Setenv(name, "")
		}
	}
	t.Setenv("CDCRELAY_DATABASE_URL", "postgres://relay@127.0.0.1:1/db")
	t.Setenv("CDCRELAY_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/")
	t.Setenv("CDCRELAY_EXCHANGE", "events")
	var stdout, stderr strings.Builder
	err := tail(context.Background(), []string{"orders.#"}, &stdout, &stderr)
	if err == nil {
		t.Fatal("tail ran without CDCRELAY_AMQP_MANAGEMENT_URL")
	}
	for _, want := range []string{"CDCRELAY_AMQP_MANAGEMENT_URL=http://", "-route", `exchange "events"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "connect to the broker") {
		t.Errorf("tail dialled the broker before it knew it could not copy the bindings: %v", err)
	}
}
