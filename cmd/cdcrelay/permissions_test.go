package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// setPermissionsRE matches a `rabbitmqctl set_permissions -p VHOST USER
// 'CONF' 'WRITE' 'READ'` line of docs/least-privilege.md.
var setPermissionsRE = regexp.MustCompile(`(?m)^rabbitmqctl set_permissions -p VHOST (\S+) '([^']*)' '([^']*)' '([^']*)'$`)

// documentedPermissions returns the configure, write and read expressions
// docs/least-privilege.md gives each broker user.
func documentedPermissions(t *testing.T) map[string][3]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "least-privilege.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][3]string{}
	for _, m := range setPermissionsRE.FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = [3]string{m[2], m[3], m[4]}
	}
	for _, user := range []string{"cdcrelay", "cdcrelay-tail"} {
		if _, ok := out[user]; !ok {
			t.Fatalf("docs/least-privilege.md has no `rabbitmqctl set_permissions -p VHOST %s '…' '…' '…'` line (found %v)", user, out)
		}
	}
	return out
}

// TestIntegrationBrokerPermissions: the broker permissions
// docs/least-privilege.md gives are enough, and no more than needed. On a
// private node, with a vhost and users made with exactly the documented
// expressions, the relay streams to the exchange events and dead-letters an
// unroutable row (CDCRELAY_UNROUTABLE=park) to events.dead with no refusal;
// the tail user declares, binds and consumes a cdcrelay.tail.… queue; and
// neither user may declare any other queue.
func TestIntegrationBrokerPermissions(t *testing.T) {
	perms := documentedPermissions(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	node := testenv.MustRabbitMQ(t, testenv.RabbitMQOptions{})
	const vhost = "orders"
	ctl := func(args ...string) {
		t.Helper()
		if _, err := node.Ctl(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
	ctl("add_vhost", vhost)
	ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*") // the administrator declares the topology
	for user, p := range perms {
		ctl("add_user", user, "secret-"+user)
		ctl("set_permissions", "-p", vhost, user, p[0], p[1], p[2])
	}
	url := func(user, password string) string {
		return "amqp://" + user + ":" + password + "@" + node.Addr() + "/" + vhost
	}
	admin := url("guest", "guest")
	orders := testenv.MustConsumer(t, admin, "events", "orders", "orders.#")
	dead := testenv.MustConsumer(t, admin, "events.dead", "dead", "#")

	pg, db := migratedPostgres(ctx, t)
	relay := testenv.StartProcess(t, builds.Relay(t, true, ""), relayEnviron(pg, url("cdcrelay", "secret-cdcrelay"), "events",
		"CDCRELAY_DEAD_LETTER_EXCHANGE=events.dead", "CDCRELAY_UNROUTABLE=park"), "run")
	for _, key := range []string{"orders.created", "payments.created", "orders.shipped"} {
		if _, err := db.Exec(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ($1, '{}')`, key); err != nil {
			t.Fatal(err)
		}
	}
	if err := orders.WaitCount(ctx, 2); err != nil {
		t.Fatalf("the relay with the documented permissions delivered %d of 2 events: %v\n%s", orders.Count(), err, relay.Log.String())
	}
	if err := dead.WaitCount(ctx, 1); err != nil {
		t.Fatalf("the unroutable row's copy never reached the dead-letter exchange: %v\n%s", err, relay.Log.String())
	}
	if got := dead.Deliveries()[0].RoutingKey; got != "payments.created" {
		t.Errorf("the dead-letter exchange received routing key %q, want payments.created", got)
	}
	if log := relay.Log.String(); strings.Contains(log, "ACCESS_REFUSED") {
		t.Errorf("the relay was refused something with the documented permissions:\n%s", log)
	}

	// tail's user: its own queue, bound to the exchange, consumed.
	_, tailCh := testenv.MustChannel(t, url("cdcrelay-tail", "secret-cdcrelay-tail"))
	q, err := tailCh.QueueDeclare(testenv.UniqueName("cdcrelay.tail.test"), false, true, true, false, nil)
	if err != nil {
		t.Fatalf("the tail user may not declare its queue: %v", err)
	}
	if err := tailCh.QueueBind(q.Name, "orders.#", "events", false, nil); err != nil {
		t.Fatalf("the tail user may not bind its queue to the exchange: %v", err)
	}
	msgs, err := tailCh.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatalf("the tail user may not consume from its queue: %v", err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('orders.paid', '{}')`); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-msgs:
		if d.RoutingKey != "orders.paid" {
			t.Errorf("tail's queue received routing key %q, want orders.paid", d.RoutingKey)
		}
	case <-ctx.Done():
		t.Fatalf("tail's queue received nothing:\n%s", relay.Log.String())
	}

	// No more than needed: neither user may declare a queue of another name.
	for user, name := range map[string]string{"cdcrelay": "cdcrelay.tail.relay", "cdcrelay-tail": "orders.copy"} {
		_, ch := testenv.MustChannel(t, url(user, "secret-"+user))
		_, err := ch.QueueDeclare(name, false, true, true, false, nil)
		var aerr *amqp.Error
		if !errors.As(err, &aerr) || aerr.Code != amqp.AccessRefused {
			t.Errorf("user %s declared queue %s: %v; want 403 ACCESS_REFUSED", user, name, err)
		}
	}
}
