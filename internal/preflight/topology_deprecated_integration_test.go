package preflight

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/brokerapi"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// queueNode is a private node with the management plugin, set up for the
// topology checks: a monitoring user (mgmtURL) and the relay's exchange.
type queueNode struct {
	node    *testenv.RabbitMQManagement
	mgmtURL string
	ch      *amqp.Channel
	version string // the broker's, from the AMQP handshake
}

func newQueueNode(t *testing.T, ctx context.Context, opts testenv.RabbitMQOptions) *queueNode {
	t.Helper()
	node := testenv.MustRabbitMQManagement(t, opts)
	for _, args := range [][]string{
		{"add_user", "monitor", mgmtPassword},
		{"set_user_tags", "monitor", "monitoring"},
		{"set_permissions", "-p", "/", "monitor", "", "", ".*"},
	} {
		if _, err := node.Ctl(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
	conn, ch := testenv.MustChannel(t, node.URL())
	if err := ch.ExchangeDeclare("events", amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	version, _ := conn.Properties["version"].(string)
	t.Logf("RabbitMQ %s", version)
	return &queueNode{node: node, ch: ch, version: version,
		mgmtURL: strings.Replace(node.ManagementURL(), "guest:guest@", "monitor:"+mgmtPassword+"@", 1)}
}

// declare declares a queue bound to the relay's exchange for every key and
// deletes it when the test ends.
func (n *queueNode) declare(t *testing.T, name string, durable, exclusive bool, args amqp.Table) {
	t.Helper()
	if _, err := n.ch.QueueDeclare(name, durable, false, exclusive, false, args); err != nil {
		t.Fatalf("declare %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := testenv.DeleteQueue(ctx, n.node.URL(), name); err != nil {
			t.Errorf("delete queue %s: %v", name, err)
		}
	})
	if err := n.ch.QueueBind(name, "#", "events", false, nil); err != nil {
		t.Fatal(err)
	}
}

// checks runs check's topology findings against the node, with the
// relay's in-flight window at 500 messages over 2 channels.
func (n *queueNode) checks(t *testing.T, ctx context.Context) []Finding {
	t.Helper()
	cfg := loadConfig(t, map[string]string{"DATABASE_URL": "postgres://relay@127.0.0.1:1/app", "AMQP_URL": n.node.URL(), "EXCHANGE": "events",
		"MAX_IN_FLIGHT": "500", "PUBLISH_CHANNELS": "2"})
	fs := topologyChecks(ctx, cfg, n.mgmtURL, Options{Timeout: 10 * time.Second})
	report(t, fs)
	return fs
}

// TestIntegrationCheckQueueWarnings runs check's warnings about quorum
// queue limits and deprecated broker features against private nodes with
// the management plugin, on whatever RabbitMQ testenv runs (3.10 by
// default, 4.3 with CDCRELAY_RABBITMQ_BIN), and holds the findings to the
// broker behaviour they describe.
func TestIntegrationCheckQueueWarnings(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n := newQueueNode(t, ctx, testenv.RabbitMQOptions{})
	v3 := strings.HasPrefix(n.version, "3.")

	t.Run("quorum limits", func(t *testing.T) {
		n.declare(t, "qq-capped", true, false, amqp.Table{"x-queue-type": "quorum", "x-max-length": int32(2), "x-overflow": "reject-publish"})
		n.declare(t, "qq-dlx", true, false, amqp.Table{"x-queue-type": "quorum", "x-max-length": int32(2), "x-overflow": "reject-publish-dlx"})
		n.declare(t, "qq-open", true, false, amqp.Table{"x-queue-type": "quorum"})
		n.declare(t, "cq-capped", true, false, amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"})
		fs := n.checks(t, ctx)
		for _, want := range []string{
			`queue "qq-capped", bound to exchange "events", has x-max-length=2 (argument) and overflow reject-publish (argument x-overflow), but a quorum queue refuses only once it is over its limit and takes what was already published: it can hold up to the relay's in-flight window past the limit (CDCRELAY_MAX_IN_FLIGHT=500, shared by CDCRELAY_PUBLISH_CHANNELS=2). Nothing is lost, but the limit is not a hard bound`,
			`queue "qq-dlx", bound to exchange "events", has x-max-length=2 (argument) and overflow reject-publish-dlx, which a quorum queue does not support (argument x-overflow): when it is full the broker acks the relay's publish and silently drops the oldest message`,
		} {
			if !hasFinding(fs, Warn, want) {
				t.Errorf("no warning with %q", want)
			}
		}
		if f := findingWith(fs, `queue "qq-capped"`); !strings.Contains(f.Remedy, "classic queue with reject-publish") || !strings.Contains(f.Remedy, "500 messages of headroom") {
			t.Errorf("qq-capped's remedy %q", f.Remedy)
		}
		for _, want := range []string{`queue "cq-capped", bound to exchange "events", has x-max-length=2 (argument) and overflow reject-publish (argument x-overflow): a full queue nacks`,
			`4 queue(s) bound to exchange "events" checked for length limits and deprecated features`} {
			if !hasFinding(fs, OK, want) {
				t.Errorf("no OK finding with %q", want)
			}
		}
		if w, e := countSeverity(fs, Warn), countSeverity(fs, Error); w != 2 || e != 0 {
			t.Errorf("%d warnings and %d errors, want 2 and 0", w, e)
		}
		if f := findingWith(fs, "qq-open"); f.Message != "" {
			t.Errorf("a quorum queue without a limit is reported: %q", f.Message)
		}

		// What the findings say of these queues, as the broker does it: a
		// quorum queue with reject-publish takes a pipelined burst past
		// its limit (a classic queue does not), and one with
		// reject-publish-dlx acks everything and drops.
		conn, pch := testenv.MustChannel(t, n.node.URL())
		qch, err := conn.Channel() // a failed passive declare closes its channel
		if err != nil {
			t.Fatal(err)
		}
		if err := pch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		publish := func(queue string, count int, pipelined bool) (acks string) {
			t.Helper()
			var pending []*amqp.DeferredConfirmation
			wait := func(dc *amqp.DeferredConfirmation) {
				ok, err := dc.WaitContext(ctx)
				if err != nil {
					t.Fatal(err)
				}
				acks += map[bool]string{true: "A", false: "N"}[ok]
			}
			for i := range count {
				dc, err := pch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{Body: []byte{byte(i)}})
				if err != nil {
					t.Fatal(err)
				}
				if pipelined {
					pending = append(pending, dc)
				} else {
					wait(dc)
				}
			}
			for _, dc := range pending {
				wait(dc)
			}
			return acks
		}
		held := func(queue string, want func(int) bool) int {
			t.Helper()
			// A quorum queue's count follows its log: give it a moment.
			deadline := time.Now().Add(10 * time.Second)
			for {
				q, err := qch.QueueDeclarePassive(queue, true, false, false, false, nil)
				if err != nil {
					t.Fatal(err)
				}
				if want(q.Messages) || time.Now().After(deadline) {
					return q.Messages
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		// How far past the limit depends on how many publishes overtake
		// the queue's first refusal: usually all 50, 31 to 39 in two runs
		// on a busy machine. Acks first, then nacks.
		acks := publish("qq-capped", 50, true)
		acked := strings.Count(acks, "A")
		if acks != strings.Repeat("A", acked)+strings.Repeat("N", 50-acked) || acked <= 3 {
			t.Errorf("quorum queue, limit 2, reject-publish, 50 pipelined: confirms %s; want more than 3 acks, then only nacks", acks)
		}
		if got := held("qq-capped", func(m int) bool { return m == acked }); got != acked {
			t.Errorf("quorum queue, limit 2, reject-publish: holds %d after %d acked publishes", got, acked)
		}
		t.Logf("quorum queue, limit 2, reject-publish, 50 pipelined: %d acked and held", acked)
		if acks := publish("cq-capped", 50, true); acks != "AA"+strings.Repeat("N", 48) {
			t.Errorf("classic queue, limit 2, reject-publish, 50 pipelined: confirms %s; want 2 acks then nacks", acks)
		}
		if got := held("cq-capped", func(m int) bool { return m == 2 }); got != 2 {
			t.Errorf("classic queue, limit 2: holds %d, want 2", got)
		}
		if acks := publish("qq-dlx", 5, false); acks != "AAAAA" {
			t.Errorf("quorum queue, limit 2, reject-publish-dlx, 5 one at a time: confirms %s; want all acked", acks)
		}
		if got := held("qq-dlx", func(m int) bool { return m == 2 }); got != 2 {
			t.Errorf("quorum queue, limit 2, reject-publish-dlx: holds %d after 5 acked publishes, want 2 (the oldest dropped)", got)
		}
	})

	// A transient queue that is not exclusive: RabbitMQ 4.3 as upstream
	// ships it refuses one (541, closing the connection) unless the node
	// permits the deprecated feature, a key 3.x would refuse to start
	// with. So 3.x declares it on the node above, 4.x on a node of its own
	// that permits it, whose list of deprecated features in use then names
	// it.
	t.Run("transient queue", func(t *testing.T) {
		tn := n
		if !v3 {
			tn = newQueueNode(t, ctx, testenv.RabbitMQOptions{Config: map[string]string{"deprecated_features.permit.transient_nonexcl_queues": "true"}})
		}
		// Neither durable nor exclusive: the deprecated queue this test is
		// about, permitted on this node.
		durable, exclusive := false, false
		tn.declare(t, "transient", durable, exclusive, nil)
		want := `queue "transient", bound to exchange "events", is transient (durable=false) and not exclusive: it loses its messages, events the relay counts as delivered, when its node restarts`
		var fs []Finding
		deadline := time.Now().Add(10 * time.Second)
		for {
			fs = tn.checks(t, ctx)
			if v3 || hasFinding(fs, Warn, `deprecated feature "transient_nonexcl_queues" is in use on the broker`) || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if !hasFinding(fs, Warn, want) {
			t.Errorf("no warning with %q", want)
		}
		api, err := newManagementAPI(loadConfig(t, map[string]string{"DATABASE_URL": "postgres://relay@127.0.0.1:1/app", "AMQP_URL": tn.node.URL()}), tn.mgmtURL)
		if err != nil {
			t.Fatal(err)
		}
		used, err := api.DeprecatedFeaturesUsed(ctx)
		wantWarnings := 2
		switch {
		case v3 && !strings.HasPrefix(tn.version, "3.13."):
			// Before 3.13 there is no such list: a 404, and no finding.
			wantWarnings = 1
			if !errors.Is(err, brokerapi.ErrNotFound) {
				t.Errorf("GET /api/deprecated-features/used on RabbitMQ %s: %v, %v; want a 404", tn.version, used, err)
			}
			if f := findingWith(fs, "in use on the broker"); f.Message != "" || hasFinding(fs, OK, "were not listed") {
				t.Errorf("a broker without the list: %q", f.Message)
			}
		case err != nil:
			t.Errorf("GET /api/deprecated-features/used on RabbitMQ %s: %v", tn.version, err)
		default:
			t.Logf("deprecated features in use: %+v", used)
			if !hasFinding(fs, Warn, `deprecated feature "transient_nonexcl_queues" is in use on the broker (somewhere on it, not necessarily by the relay's queues; `) {
				t.Errorf("the broker's list names no transient_nonexcl_queues, or check did not report it: %+v", used)
			}
		}
		if w, e := countSeverity(fs, Warn), countSeverity(fs, Error); w != wantWarnings || e != 0 {
			t.Errorf("%d warnings and %d errors, want %d and 0", w, e, wantWarnings)
		}
	})
}
