//go:build faults

package faults_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationBrokerOutage stops a real broker node (a private one: the machine's
// shared broker is never touched), commits 50 events while it is down, and
// starts it again: all 50 arrive in commit order within 30 s, without
// restarting the relay. The relay runs with the product's default backoff
// (500ms doubling to 30s).
func TestIntegrationBrokerOutage(t *testing.T) {
	rmq := testenv.MustRabbitMQ(t, testenv.RabbitMQOptions{})
	w := newWorld(t, worldOptions{Broker: rmq})
	r := w.startRelay(map[string]string{"BACKOFF_MAX": "30s"})
	r.waitStreaming(t)
	ctx := context.Background()

	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)

	down := time.Now()
	if err := rmq.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := time.Since(down)
	var during []commit
	for i := range 50 {
		ids, err := insertTx(ctx, w.db, routingKeys[i%len(routingKeys)], 1)
		if err != nil {
			t.Fatalf("insert while the broker is down: %v", err)
		}
		during = append(during, commit{at: time.Now(), ids: ids})
	}
	time.Sleep(max(0, 8*time.Second-time.Since(down)))
	if err := rmq.Start(ctx); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	var ids []string
	for _, c := range during {
		ids = append(ids, c.ids...)
	}
	w.waitIDs(t, ids, 30*time.Second)
	arrived := time.Since(up)
	r.running(t)

	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	r.running(t)
	r.transportFailuresOnly(t)
	o := w.check(t, "broker stopped and started (rabbitmqctl stop), 50 events committed while down", up, during,
		fmt.Sprintf("down %s (stop took %s); all 50 arrived %s after the broker accepted connections; relay restarts %d",
			up.Sub(down).Round(100*time.Millisecond), stopped.Round(100*time.Millisecond), arrived.Round(10*time.Millisecond), r.restarts(t)))
	if o.RecoverSec > 30 {
		t.Fatalf("the 50 events took %.1fs after the broker came back, want at most 30s", o.RecoverSec)
	}
	t.Logf("relay failures: %s", strings.Join(r.failures(), " | "))
}

// TestIntegrationBrokerOutageUnderLoad stops and starts the broker node in the middle
// of a steady load of 5,000 events.
func TestIntegrationBrokerOutageUnderLoad(t *testing.T) {
	rmq := testenv.MustRabbitMQ(t, testenv.RabbitMQOptions{})
	w := newWorld(t, worldOptions{Broker: rmq})
	r := w.startRelay(map[string]string{"BACKOFF_MAX": "30s"})
	r.waitStreaming(t)
	ctx := context.Background()

	l := w.load(5000, 300, 3)
	l.waitEvents(t, 1000, time.Minute)
	down := time.Now()
	if err := rmq.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(max(0, 3*time.Second-time.Since(down)))
	if err := rmq.Start(ctx); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	l.wait(t, 2*time.Minute)
	w.waitAll(t, time.Minute)
	r.running(t)
	r.transportFailuresOnly(t)
	w.check(t, "broker stopped and started under a steady load (300 ev/s)", up, l.since(down),
		fmt.Sprintf("down %s; %d events committed while down; relay restarts %d",
			up.Sub(down).Round(100*time.Millisecond), len(ids(l.since(down)))-len(ids(l.since(up))), r.restarts(t)))
	t.Logf("relay failures: %s", strings.Join(r.failures(), " | "))
}

// TestIntegrationBrokerBlocksPublishers raises the broker's memory alarm
// (set_vm_memory_high_watermark 0 on a private node), which blocks every
// publishing connection, for longer than twice wal_sender_timeout (5s):
// status updates keep flowing so PostgreSQL does not kill the walsender,
// the confirm timeout (3s here) is paused rather than restarting the
// pipeline, and the relay resumes on its own when the alarm clears.
func TestIntegrationBrokerBlocksPublishers(t *testing.T) {
	const walSenderTimeout = 5 * time.Second
	rmq := testenv.MustRabbitMQ(t, testenv.RabbitMQOptions{})
	w := newWorld(t, worldOptions{Broker: rmq, PG: testenv.PostgresOptions{Settings: map[string]string{
		"wal_sender_timeout": walSenderTimeout.String(),
	}}})
	r := w.startRelay(map[string]string{"CONFIRM_TIMEOUT": "3s"})
	r.waitStreaming(t)
	ctx := context.Background()

	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	pid := testenv.WaitSlotActive(t, w.db, slotName, 10*time.Second)
	restarts := r.restarts(t)

	if err := rmq.SetMemoryHighWatermark(ctx, 0); err != nil {
		t.Fatal(err)
	}
	blocked := time.Now()
	t.Cleanup(func() { _ = rmq.SetMemoryHighWatermark(context.Background(), 0.4) })
	var during []commit
	for i := range 50 {
		ids, err := insertTx(ctx, w.db, routingKeys[i%len(routingKeys)], 10)
		if err != nil {
			t.Fatal(err)
		}
		during = append(during, commit{at: time.Now(), ids: ids})
	}
	waitFor(t, "relay sees the broker block publishers", 10*time.Second, func() bool {
		return r.metric(t, "cdcrelay_broker_blocked") == 1
	})
	// Hold the block for more than twice wal_sender_timeout, checking all
	// along that the walsender lives and hears from the relay.
	var oldestReply time.Duration
	for time.Since(blocked) < 2*walSenderTimeout+3*time.Second {
		if now := testenv.Walsender(t, w.db, slotName); now != pid {
			t.Fatalf("walsender %d replaced by %d while the broker blocked publishers", pid, now)
		}
		var age time.Duration
		err := w.db.QueryRow(ctx, `SELECT coalesce(now() - reply_time, '1h') FROM pg_stat_replication WHERE pid = $1`, pid).Scan(&age)
		if err != nil {
			t.Fatal(err)
		}
		oldestReply = max(oldestReply, age)
		time.Sleep(250 * time.Millisecond)
	}
	if oldestReply >= walSenderTimeout {
		t.Fatalf("PostgreSQL went %s without a status update (wal_sender_timeout %s)", oldestReply, walSenderTimeout)
	}
	if log := w.pg.ServerLog(); strings.Contains(log, "replication timeout") {
		t.Fatalf("server log reports a replication timeout:\n%s", log)
	}
	if n := r.restarts(t); n != restarts {
		t.Fatalf("the relay restarted %d times while the broker blocked publishers: %v", n-restarts, r.failures())
	}
	heldFor := time.Since(blocked)

	if err := rmq.SetMemoryHighWatermark(ctx, 0.4); err != nil {
		t.Fatal(err)
	}
	unblocked := time.Now()
	w.waitIDs(t, ids(during), 30*time.Second)
	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	r.running(t)
	if now := testenv.Walsender(t, w.db, slotName); now != pid {
		t.Fatalf("walsender %d replaced by %d", pid, now)
	}
	w.check(t, "broker blocks publishers (memory alarm) for > 2 x wal_sender_timeout", unblocked, during,
		fmt.Sprintf("blocked %s with wal_sender_timeout %s; same walsender throughout, longest gap between status updates %s, 0 relay restarts",
			heldFor.Round(100*time.Millisecond), walSenderTimeout, oldestReply.Round(100*time.Millisecond)))
}

// TestIntegrationBrokerBlackhole partitions the relay from the broker (no RST, no FIN:
// bytes just stop) for 20s in the middle of a steady load. Heartbeats
// notice the silent link; the relay restarts, its connection attempts
// through the partition fail (the proxy accepts TCP but nothing answers,
// like a load balancer in front of a dead broker) rather than hang, and
// once the partition heals it publishes everything unconfirmed again, in
// order.
func TestIntegrationBrokerBlackhole(t *testing.T) {
	const (
		heartbeat = 2 * time.Second
		partition = 20 * time.Second
	)
	w := newWorld(t, worldOptions{AMQPProxy: true})
	r := w.startRelay(map[string]string{"AMQP_HEARTBEAT": heartbeat.String()})
	r.waitStreaming(t)

	l := w.load(3000, 150, 3)
	testenv.WaitCount(t, w.consumer, 1000, time.Minute)
	fault := time.Now()
	w.amqpProxy.Blackhole(true)
	// amqp091-go gives up on a connection that has been silent for three
	// heartbeats; allow one more for scheduling.
	waitFor(t, "relay notices the black-holed broker", 4*heartbeat+2*time.Second, func() bool { return r.restarts(t) >= 1 })
	detected := time.Since(fault)
	time.Sleep(max(0, partition-time.Since(fault)))
	attempts := r.metric(t, `cdcrelay_connect_failures_total`)
	healed := time.Now()
	w.amqpProxy.Blackhole(false)
	l.wait(t, time.Minute)
	w.waitAll(t, time.Minute)
	r.running(t)
	r.transportFailuresOnly(t)
	w.check(t, "broker link black-holed 20s under load", healed, l.since(fault),
		fmt.Sprintf("noticed after %s (heartbeat %s); %v failed connection attempts during the partition", detected.Round(100*time.Millisecond), heartbeat, attempts))
	if attempts < 1 {
		t.Fatalf("no failed connection attempt in %s of partition: the relay's broker handshake hangs instead of timing out", partition-detected)
	}
}
