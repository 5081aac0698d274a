package testenv

import (
	"context"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/svckit/brokernode"
)

// RabbitMQCluster is a cluster of private nodes (brokernode.RabbitMQCluster,
// whose methods it has) with MustConsumer on top: a defined type rather
// than an alias, since MustConsumer takes a testing.TB.
type RabbitMQCluster struct{ *brokernode.RabbitMQCluster }

// StartRabbitMQCluster is brokernode.StartRabbitMQCluster: the caller must
// Close the cluster. Tests use MustRabbitMQCluster.
func StartRabbitMQCluster(ctx context.Context, n int, opts RabbitMQOptions) (*RabbitMQCluster, error) {
	c, err := brokernode.StartRabbitMQCluster(ctx, n, opts)
	if err != nil {
		return nil, err
	}
	return &RabbitMQCluster{c}, nil
}

// MustRabbitMQCluster starts an n-node cluster for the test and closes it
// when the test ends, whatever the outcome. A machine without
// rabbitmq-server fails the test: it is never skipped. If the test failed,
// the tail of each node's log is logged first.
func MustRabbitMQCluster(tb testing.TB, n int, opts RabbitMQOptions) *RabbitMQCluster {
	tb.Helper()
	RequireIntegration(tb, "a private RabbitMQ cluster")
	ctx, cancel := context.WithTimeout(context.Background(), 2*setupTimeout)
	defer cancel()
	c, err := StartRabbitMQCluster(ctx, n, opts)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			for i := range c.Len() {
				r := c.Node(i)
				tb.Logf("rabbitmq node %d log (last 30 lines, %s):\n%s", i, r.Dir(), Tail(r.ServerLog(), 30))
			}
		}
		if err := c.Close(); err != nil {
			tb.Errorf("close rabbitmq cluster: %v", err)
		}
	})
	return c
}

// MustConsumer starts a test consumer of a durable quorum queue bound to
// exchange with bindingKey (both declared if missing), connected through
// node first and, whenever its connection drops (a killed node), through
// the next nodes in turn; the queue keeps what arrives meanwhile. It is
// closed when the test ends.
func (c *RabbitMQCluster) MustConsumer(tb testing.TB, first int, exchange, queue, bindingKey string) *Consumer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	con, err := c.NewConsumer(ctx, first, exchange, queue, bindingKey)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		if err := con.Close(); err != nil {
			tb.Logf("close consumer: %v", err)
		}
	})
	return con
}
