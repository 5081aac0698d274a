//go:build faults

package faults_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
	"github.com/cdcrelay/cdcrelay/migrations"
)

// TestIntegrationBrokerCluster runs the relay against a real 3-node
// RabbitMQ cluster (private nodes on this host; the machine's shared broker
// is never touched), with CDCRELAY_AMQP_URL naming all three nodes and a
// quorum queue, replicated on every node, bound to the relay's exchange.
// One cluster serves both scenarios: starting it is most of the cost.
func TestIntegrationBrokerCluster(t *testing.T) {
	cl := testenv.MustRabbitMQCluster(t, 3, testenv.RabbitMQOptions{})
	t.Run("MemoryAlarmOnAnotherNode", func(t *testing.T) { clusterMemoryAlarm(t, cl) })
	t.Run("KillConnectedNode", func(t *testing.T) { clusterKillConnectedNode(t, cl) })
}

// clusterWorld is a world whose broker is the cluster: the relay gets the
// multi-host URL, the consumer reads a quorum queue through a node the
// test chooses once it knows the relay's.
type clusterWorld struct {
	*world
	cl    *testenv.RabbitMQCluster
	queue string
	relay *relaytest.InProcess
	node  int // the node the relay connected to first
}

// newClusterWorld starts PostgreSQL with the outbox, declares the
// exchange and the quorum queue through node 0, starts the relay (with
// its janitor, so rows end marked) on the multi-host URL, finds the node it
// connected to, and starts the consumer on another node.
func newClusterWorld(t *testing.T, cl *testenv.RabbitMQCluster, consumerAvoids func(relayNode int) int) *clusterWorld {
	t.Helper()
	ctx := context.Background()
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	if err := pg.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, pg: pg, dbURL: pg.URL("app"), amqpURL: cl.MultiURL(), exchange: testenv.UniqueName("cdcrelay.cluster")}
	w.db = relaytest.Connect(t, w.dbURL)
	if err := migrations.Apply(ctx, w.db); err != nil {
		t.Fatal(err)
	}
	cw := &clusterWorld{world: w, cl: cl, queue: testenv.UniqueName("cdcrelay.cluster.q")}
	if err := cl.DeclareQuorumQueue(ctx, 0, w.exchange, cw.queue, "#"); err != nil {
		t.Fatal(err)
	}
	cfg := relaytest.Config(t, w.vars(nil))
	if got := len(cfg.AMQPNodes()); got != cl.Len() {
		t.Fatalf("the relay's configuration holds %d broker nodes, want %d", got, cl.Len())
	}
	level, _ := cfg.Level()
	cw.relay = relaytest.Start(t, cfg, relaytest.InProcessOptions{Level: level})
	t.Cleanup(func() {
		if err := cw.relay.Stop(); err != nil {
			t.Errorf("relay: %v", err)
		}
		if t.Failed() {
			t.Logf("relay log (last 60 lines):\n%s", testenv.Tail(cw.relay.Logs.String(), 60))
		}
	})
	cw.relay.WaitStreaming(t)
	cw.node = cw.connectedNode(t)
	w.consumer = cl.MustConsumer(t, consumerAvoids(cw.node), w.exchange, cw.queue, "#")
	return cw
}

// brokerNodeLine is the relay's log line for each broker connection.
var brokerNodeLine = regexp.MustCompile(`msg="connected to broker node" node=(\S+)`)

// connectedNode is the cluster node of the relay's latest broker
// connection, from its log, checked against the node's own list of
// connections.
func (cw *clusterWorld) connectedNode(t *testing.T) int {
	t.Helper()
	m := brokerNodeLine.FindAllStringSubmatch(cw.relay.Logs.String(), -1)
	if len(m) == 0 {
		t.Fatal("the relay logged no broker connection")
	}
	addr := m[len(m)-1][1]
	i := cw.cl.IndexOf(addr)
	if i < 0 {
		t.Fatalf("the relay logged a connection to %s, which is no node of the cluster", addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conns, err := cw.cl.Node(i).Ctl(ctx, "list_connections", "client_properties")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(conns, "cdcrelay "+slotName) {
		t.Fatalf("node %d (%s) lists no relay connection:\n%s", i, addr, conns)
	}
	return i
}

// metric sums a counter or gauge of the relay.
func (cw *clusterWorld) metric(t *testing.T, name string) float64 {
	return (&inproc{cw.relay}).metric(t, name)
}

// confirms is the number of broker confirms the relay has timed.
func (cw *clusterWorld) confirms(t *testing.T) uint64 {
	t.Helper()
	fams, err := cw.relay.Reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "cdcrelay_confirm_latency_seconds" {
			var n uint64
			for _, m := range f.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
			return n
		}
	}
	return 0
}

// waitMarked waits until every outbox row has published_at set.
func (cw *clusterWorld) waitMarked(t *testing.T, within time.Duration) {
	t.Helper()
	var left int
	waitFor(t, "every row marked published_at", within, func() bool {
		err := cw.db.QueryRow(context.Background(), `SELECT count(*) FROM event_outbox WHERE published_at IS NULL`).Scan(&left)
		return err == nil && left == 0
	})
}

// clusterKillConnectedNode kills (SIGKILL) the node the relay publishes
// through, under a steady load of 200 ev/s: the same relay process goes on
// through another node within seconds, nothing committed is missing,
// duplicates (events published again because their confirms died with the
// node) are counted, and every row ends marked.
func clusterKillConnectedNode(t *testing.T, cl *testenv.RabbitMQCluster) {
	cw := newClusterWorld(t, cl, func(relay int) int { return (relay + 1) % cl.Len() })
	victim := cw.node
	l := cw.load(4000, 200, 4)
	l.waitEvents(t, 1000, time.Minute)
	restarts := (&inproc{cw.relay}).restarts(t)
	before := cw.confirms(t)

	killed := time.Now()
	cl.Kill(victim)
	// Measured, not waited for: when the relay connects to another node,
	// and when the broker confirms its first publish there.
	var reconnected, resumed time.Time
	waitFor(t, "the relay publishes again through another node", time.Minute, func() bool {
		if reconnected.IsZero() && cw.metric(t, "cdcrelay_broker_node_switches_total") >= 1 {
			reconnected = time.Now()
		}
		if !reconnected.IsZero() && cw.confirms(t) > before {
			resumed = time.Now()
		}
		return !resumed.IsZero()
	})
	now := cw.connectedNode(t)
	if now == victim {
		t.Fatalf("the relay reconnected to node %d, the one killed", victim)
	}
	l.wait(t, 2*time.Minute)
	cw.waitAll(t, time.Minute)
	cw.waitMarked(t, time.Minute)
	r := &inproc{cw.relay}
	r.running(t)
	r.transportFailuresOnly(t) // the confirms that died with the node are no nacks
	n := r.restarts(t) - restarts
	if n < 1 {
		t.Fatalf("the relay did not restart its session after its broker node was killed")
	}
	gap := resumed.Sub(killed)
	o := cw.check(t, "3-node RabbitMQ cluster: the node the relay publishes through killed (SIGKILL) under 200 ev/s, quorum queue", killed, l.since(killed),
		fmt.Sprintf("node %d killed, relay on node %d after %s, first confirm %s after the kill; %d session restart(s), same process; every row marked",
			victim, now, reconnected.Sub(killed).Round(10*time.Millisecond), gap.Round(10*time.Millisecond), n))
	t.Logf("cluster kill: %d events, 0 missing, %d duplicates (published again after the kill), publishing again %s after the kill",
		o.Events, o.Duplicates, gap.Round(10*time.Millisecond))
	t.Logf("relay failures: %s", strings.Join(r.failures(), " | "))
}

// clusterMemoryAlarm raises the memory alarm on a node the relay is not
// connected to: the cluster blocks every publishing connection, the
// relay's included; the relay waits, blocked, without restarting its
// session, and when the alarm clears delivers everything once.
func clusterMemoryAlarm(t *testing.T, cl *testenv.RabbitMQCluster) {
	cw := newClusterWorld(t, cl, func(relay int) int { return (relay + 2) % cl.Len() })
	ctx := context.Background()
	alarmed := cl.Node((cw.node + 1) % cl.Len())
	r := &inproc{cw.relay}

	cw.waitIDs(t, cw.insert(t, 100, 10), time.Minute)
	restarts := r.restarts(t)
	delivered := cw.consumer.Count()

	if err := alarmed.SetMemoryHighWatermark(ctx, 0); err != nil {
		t.Fatal(err)
	}
	blocked := time.Now()
	t.Cleanup(func() { _ = alarmed.SetMemoryHighWatermark(context.Background(), 0.4) })
	during := cw.insertCommits(t, 50, 10)
	waitFor(t, "the relay sees the cluster block its publishing connection", 30*time.Second, func() bool {
		return cw.metric(t, "cdcrelay_broker_blocked") == 1
	})
	seen := time.Since(blocked)
	// Hold the alarm a while (the fault's length, not a measure of speed):
	// nothing committed meanwhile may reach the consumer through a node
	// without the alarm.
	time.Sleep(max(0, 3*time.Second-time.Since(blocked)))
	if got := cw.consumer.Count(); got != delivered {
		t.Fatalf("%d of the 500 events committed during the alarm were delivered while the cluster blocked publishers", got-delivered)
	}
	if err := alarmed.SetMemoryHighWatermark(ctx, 0.4); err != nil {
		t.Fatal(err)
	}
	cleared := time.Now()
	cw.waitIDs(t, ids(during), time.Minute)
	caughtUp := time.Since(cleared)
	cw.waitIDs(t, cw.insert(t, 20, 10), time.Minute)
	cw.waitMarked(t, time.Minute)
	r.running(t)
	if n := r.restarts(t); n != restarts {
		t.Fatalf("the relay restarted its session %d times while the cluster blocked it: %v", n-restarts, r.failures())
	}
	if now := cw.connectedNode(t); now != cw.node {
		t.Fatalf("the relay moved from node %d to node %d", cw.node, now)
	}
	o := cw.check(t, "3-node RabbitMQ cluster: memory alarm on a node the relay is not connected to, 500 events committed while blocked", cleared, during,
		fmt.Sprintf("blocked seen after %s, alarm held %s; all 500 delivered %s after it cleared; 0 session restarts, same node",
			seen.Round(10*time.Millisecond), cleared.Sub(blocked).Round(10*time.Millisecond), caughtUp.Round(10*time.Millisecond)))
	if o.Duplicates != 0 {
		t.Fatalf("%d duplicates: a block must not make the relay publish anything twice", o.Duplicates)
	}
}
