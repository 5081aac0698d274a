package testenv

import (
	"context"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/svckit/brokernode"
)

// RabbitMQBinEnv overrides the directory holding rabbitmq-server and
// rabbitmqctl.
const RabbitMQBinEnv = brokernode.RabbitMQBinEnv

// RabbitMQConfigEnv adds rabbitmq.conf settings to every private node.
const RabbitMQConfigEnv = brokernode.RabbitMQConfigEnv

// RabbitMQOptions tunes a private broker node.
type RabbitMQOptions = brokernode.RabbitMQOptions

// RabbitMQ is a private broker node (brokernode.RabbitMQ).
type RabbitMQ = brokernode.RabbitMQ

// RabbitMQManagement is a private node with the management plugin.
type RabbitMQManagement = brokernode.RabbitMQManagement

// StartRabbitMQ is brokernode.StartRabbitMQ: the caller must Close the
// node. Tests use MustRabbitMQ.
func StartRabbitMQ(ctx context.Context, opts RabbitMQOptions) (*RabbitMQ, error) {
	return brokernode.StartRabbitMQ(ctx, opts)
}

// StartRabbitMQManagement is brokernode.StartRabbitMQManagement. Tests use
// MustRabbitMQManagement.
func StartRabbitMQManagement(ctx context.Context, opts RabbitMQOptions) (*RabbitMQManagement, error) {
	return brokernode.StartRabbitMQManagement(ctx, opts)
}

// MustRabbitMQ starts a private broker node for the test and stops and
// removes it when the test ends, whatever the outcome. If the test failed,
// the tail of the node's log is logged first.
func MustRabbitMQ(tb testing.TB, opts RabbitMQOptions) *RabbitMQ {
	tb.Helper()
	RequireIntegration(tb, "a private RabbitMQ node")
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	r, err := StartRabbitMQ(ctx, opts)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("rabbitmq log (last 40 lines, %s):\n%s", r.Dir(), Tail(r.ServerLog(), 40))
		}
		if err := r.Close(); err != nil {
			tb.Errorf("close rabbitmq: %v", err)
		}
	})
	return r
}

// MustRabbitMQManagement is MustRabbitMQ for a node with the management
// plugin: stopped and removed when the test ends, its log tail logged if
// the test failed.
func MustRabbitMQManagement(tb testing.TB, opts RabbitMQOptions) *RabbitMQManagement {
	tb.Helper()
	RequireIntegration(tb, "a private RabbitMQ node with the management plugin")
	// A node takes up to a minute to boot on a busy two-core machine, and
	// starting the plugin's applications (web server, stats) about as long
	// again: setupTimeout for each.
	ctx, cancel := context.WithTimeout(context.Background(), 2*setupTimeout)
	defer cancel()
	m, err := StartRabbitMQManagement(ctx, opts)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("rabbitmq log (last 40 lines, %s):\n%s", m.Dir(), Tail(m.ServerLog(), 40))
		}
		if err := m.Close(); err != nil {
			tb.Errorf("close rabbitmq: %v", err)
		}
	})
	return m
}
