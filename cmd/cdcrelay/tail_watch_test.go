package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/brokerapi"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationTailWatches runs tail in its default mode against a
// private node with the management API: watching never makes an event
// routable, even one the relay is stalled on; and a least-privilege user
// is told which permissions tail lacks.
func TestIntegrationTailWatches(t *testing.T) {
	node := testenv.MustRabbitMQManagement(t, testenv.RabbitMQOptions{})
	t.Run("NeverARoute", func(t *testing.T) { tailNeverARoute(t, node) })
	t.Run("RelayStalled", func(t *testing.T) { tailDuringStall(t, node) })
	t.Run("LeastPrivilege", func(t *testing.T) { tailLeastPrivilege(t, node) })
}

// tailNeverARoute: with tail '#' running, a key no queue is bound for is
// returned to a mandatory publisher, a bound key reaches the queue and tail
// shows it, and once the queue's binding is removed its key is returned
// again (tail dropped its copy).
func tailNeverARoute(t *testing.T, node *testenv.RabbitMQManagement) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exchange := testenv.UniqueName("cdcrelay.watch")
	queue := testenv.UniqueName("cdcrelay.watch")
	consumer := testenv.MustConsumer(t, node.URL(), exchange, queue, "orders.#") // declares the exchange
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})                     // the configuration names a database
	p := startTail(t, relayEnviron(pg, node.URL(), exchange, "CDCRELAY_AMQP_MANAGEMENT_URL="+node.ManagementURL()), "#")
	ch := confirmingChannel(t, node.URL())

	if !publishMandatory(ctx, t, ch, exchange, "payments.created", "p-1") {
		t.Errorf("payments.created was routed with tail '#' running and no queue bound for it: tail made it routable")
	}
	if publishMandatory(ctx, t, ch, exchange, "orders.created", "o-1") {
		t.Fatal("orders.created was returned though a queue is bound for it")
	}
	if err := consumer.WaitCount(ctx, 1); err != nil {
		t.Fatal(err)
	}
	waitLog(ctx, t, p, "message_id=o-1")

	api := managementClient(t, node)
	if err := unbind(ctx, node.URL(), queue, exchange); err != nil {
		t.Fatal(err)
	}
	// Wait until tail's copies are gone too: every binding left is tail's.
	for {
		bs, err := api.Bindings(ctx, "/", exchange)
		if err != nil {
			t.Fatal(err)
		}
		if len(bs) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("tail kept its copy of a removed binding: %+v", bs)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if !publishMandatory(ctx, t, ch, exchange, "orders.shipped", "o-2") {
		t.Error("orders.shipped was routed after the only queue bound for it was unbound: tail's copy outlived the binding")
	}
	if strings.Contains(p.Log.String(), "p-1") || strings.Contains(p.Log.String(), "o-2") {
		t.Errorf("tail received a message no queue was bound for:\n%s", p.Log.String())
	}
	if !strings.Contains(p.Log.String(), `no queue is bound to exchange "`+exchange+`"`) {
		t.Errorf("tail did not say that nothing is bound any more:\n%s", p.Log.String())
	}
}

// tailDuringStall: the relay stalls on a row no queue is bound for; tail
// '#' started then must not unstall it by becoming its route. Binding a
// queue for it does, and the row goes to that queue.
func tailDuringStall(t *testing.T, node *testenv.RabbitMQManagement) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pg, db := migratedPostgres(ctx, t)
	exchange := testenv.UniqueName("cdcrelay.stall")
	orders := testenv.MustConsumer(t, node.URL(), exchange, testenv.UniqueName("cdcrelay.orders"), "orders.#")
	env := relayEnviron(pg, node.URL(), exchange, "CDCRELAY_AMQP_MANAGEMENT_URL="+node.ManagementURL())
	relay := testenv.StartProcess(t, builds.Relay(t, true, ""), env, "run")
	if _, err := db.Exec(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('payments.created', '{"n":1}'), ('orders.created', '{"n":2}')`); err != nil {
		t.Fatal(err)
	}
	waitCount(ctx, t, relay, "unroutable", 1)
	p := startTail(t, env, "#")
	// The relay publishes the stalled row again after a backoff: two more
	// refusals with tail bound show that tail is no route for it. (The
	// orders row may have gone already: each routing key has its lane.)
	waitCount(ctx, t, relay, "unroutable", strings.Count(relay.Log.String(), "unroutable")+2)
	var stalled int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM event_outbox WHERE published_at IS NULL AND routing_key = 'payments.created'`).Scan(&stalled); err != nil {
		t.Fatal(err)
	}
	if stalled != 1 {
		t.Fatal("with tail running during the stall, the stalled row was marked published")
	}
	if strings.Contains(p.Log.String(), "payments.created") {
		t.Fatalf("tail received the stalled row:\n%s", p.Log.String())
	}
	payments := testenv.MustConsumer(t, node.URL(), exchange, testenv.UniqueName("cdcrelay.payments"), "payments.#")
	if err := payments.WaitCount(ctx, 1); err != nil {
		t.Fatalf("the stalled row never reached the queue bound for it: %v", err)
	}
	if err := orders.WaitCount(ctx, 1); err != nil {
		t.Fatalf("the orders row never arrived: %v", err)
	}
	// Once the stream flows, tail shows what the queues get.
	if _, err := db.Exec(ctx, `INSERT INTO event_outbox (routing_key, payload) VALUES ('orders.shipped', '{"n":3}')`); err != nil {
		t.Fatal(err)
	}
	waitLog(ctx, t, p, "routing_key=orders.shipped")
}

// tailLeastPrivilege: a user with the relay's permissions only (write on
// the exchange) is told what tail needs; with those granted, tail runs.
func tailLeastPrivilege(t *testing.T, node *testenv.RabbitMQManagement) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exchange := testenv.UniqueName("cdcrelay.lp")
	if err := testenv.DeclareExchange(ctx, node.URL(), exchange); err != nil {
		t.Fatal(err)
	}
	user := testenv.UniqueName("watcher")
	for _, args := range [][]string{
		{"add_user", user, "watcher-pw"},
		{"set_user_tags", user, "monitoring"},
		{"set_permissions", "-p", "/", user, "^$", "^" + exchange + "$", "^$"},
	} {
		if out, err := node.Ctl(ctx, args...); err != nil {
			t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
		}
	}
	amqpURL := fmt.Sprintf("amqp://%s:watcher-pw@%s/", user, node.Addr())
	mgmtURL := strings.Replace(node.ManagementURL(), "guest:guest", user+":watcher-pw", 1)
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	env := relayEnviron(pg, amqpURL, exchange, "CDCRELAY_AMQP_MANAGEMENT_URL="+mgmtURL)
	p := testenv.StartProcess(t, builds.Relay(t, true, ""), env, "tail")
	if err := p.Wait(t, time.Minute); err == nil {
		t.Fatalf("tail ran without the permissions it needs:\n%s", p.Log.String())
	}
	want := fmt.Sprintf(`rabbitmqctl set_permissions -p / %s '^cdcrelay\.tail\.' '^cdcrelay\.tail\.' '^(cdcrelay\.tail\..*|%s)$'`, user, strings.ReplaceAll(exchange, ".", `\.`))
	for _, s := range []string{"ACCESS_REFUSED", "configure and write on its queues", want} {
		if !strings.Contains(p.Log.String(), s) {
			t.Errorf("tail's error lacks %q:\n%s", s, p.Log.String())
		}
	}
	// The grant the error printed, as printed.
	q, x := `^cdcrelay\.tail\.`, `^(cdcrelay\.tail\..*|`+strings.ReplaceAll(exchange, ".", `\.`)+`)$`
	if out, err := node.Ctl(ctx, "set_permissions", "-p", "/", user, q, q, x); err != nil {
		t.Fatalf("set_permissions: %v\n%s", err, out)
	}
	startTail(t, env, "#")
}

// startTail starts tail with args and waits until it consumes.
func startTail(t *testing.T, env []string, args ...string) *testenv.Process {
	t.Helper()
	p := testenv.StartProcess(t, builds.Relay(t, true, ""), env, append([]string{"tail"}, args...)...)
	for !strings.Contains(p.Log.String(), "waiting for messages") {
		if exited, err := p.Exited(); exited {
			t.Fatalf("tail exited (%v):\n%s", err, p.Log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}

// confirmingChannel is a channel in confirm mode on url.
func confirmingChannel(t *testing.T, url string) *amqp.Channel {
	t.Helper()
	_, ch := testenv.MustChannel(t, url)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return ch
}

// publishMandatory publishes with mandatory set, as the relay does, and
// reports whether the broker returned the message as unroutable. The
// broker sends basic.return before the ack, and the client hands them
// over in that order, so the return is there once the ack is.
func publishMandatory(ctx context.Context, t *testing.T, ch *amqp.Channel, exchange, key, id string) (returned bool) {
	t.Helper()
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, amqp.Publishing{MessageId: id, Body: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		t.Fatalf("publish %s: acked=%v err=%v", key, ok, err)
	}
	select {
	case <-returns:
		return true
	default:
		return false
	}
}

// waitLog waits until p's output contains s.
func waitLog(ctx context.Context, t *testing.T, p *testenv.Process, s string) {
	t.Helper()
	waitCount(ctx, t, p, s, 1)
}

// waitCount waits until p's output contains s n times.
func waitCount(ctx context.Context, t *testing.T, p *testenv.Process, s string, n int) {
	t.Helper()
	for strings.Count(p.Log.String(), s) < n {
		select {
		case <-ctx.Done():
			t.Fatalf("%q appeared %d times, want %d:\n%s", s, strings.Count(p.Log.String(), s), n, testenv.Tail(p.Log.String(), 40))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// managementClient reads node's management API as guest.
func managementClient(t *testing.T, node *testenv.RabbitMQManagement) *brokerapi.Client {
	t.Helper()
	api, err := brokerapi.New(node.ManagementURL(), "the test node", nil)
	if err != nil {
		t.Fatal(err)
	}
	return api
}

// unbind removes queue's orders.# binding to exchange.
func unbind(ctx context.Context, url, queue, exchange string) error {
	conn, err := testenv.DialAMQP(ctx, url)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return ch.QueueUnbind(queue, "orders.#", exchange, nil)
}
