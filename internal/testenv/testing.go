package testenv

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/svckit"
)

// setupTimeout bounds starting a service from a test.
const setupTimeout = 60 * time.Second

// MustPostgres starts a throwaway cluster for the test and removes it when the
// test ends. If the test failed, the tail of the server log is logged first,
// since that is usually where the reason is.
func MustPostgres(tb testing.TB, opts PostgresOptions) *Postgres {
	tb.Helper()
	RequireIntegration(tb, "PostgreSQL")
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	p, err := StartPostgres(ctx, opts)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("postgres server log (last 50 lines, %s):\n%s", p.DataDir(), Tail(p.ServerLog(), 50))
		}
		if err := p.Close(); err != nil {
			tb.Errorf("close postgres: %v", err)
		}
	})
	return p
}

// RequireAMQP returns the broker URL after checking it is reachable. An
// unreachable broker fails the test: it is never skipped, so a CI job without
// RabbitMQ cannot pass by testing nothing.
func RequireAMQP(tb testing.TB) string {
	tb.Helper()
	RequireIntegration(tb, "RabbitMQ")
	url := AMQPURL()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := CheckAMQP(ctx, url); err != nil {
		tb.Fatalf("RabbitMQ is required for this test (set %s to use another broker): %v", AMQPURLEnv, err)
	}
	return url
}

// MustChannel opens a connection and a channel to the broker at url for
// the test; the connection closes when the test ends.
func MustChannel(tb testing.TB, url string) (*amqp.Connection, *amqp.Channel) {
	tb.Helper()
	RequireIntegration(tb, "RabbitMQ")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := DialAMQP(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	// A deadline: a broker that blocks publishers (a test that failed
	// during a resource alarm) never answers connection.close, and a plain
	// Close would hang the test binary until its timeout.
	tb.Cleanup(func() { _ = conn.CloseDeadline(time.Now().Add(5 * time.Second)) })
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatal(err)
	}
	return conn, ch
}

// MustConsumer starts a Consumer for the test and closes it (deleting its
// queue) when the test ends.
func MustConsumer(tb testing.TB, url, exchange, queue, bindingKey string) *Consumer {
	tb.Helper()
	RequireIntegration(tb, "RabbitMQ")
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	c, err := NewConsumer(ctx, url, exchange, queue, bindingKey)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		// Best effort: a test that leaves the broker stopped should not fail
		// again here.
		if err := c.Close(); err != nil {
			tb.Logf("close consumer: %v", err)
		}
	})
	return c
}

// MustProxy starts a fault proxy to target for the test and closes it when
// the test ends.
func MustProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := NewProxy(target)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Errorf("close proxy: %v", err)
		}
	})
	return p
}

// UniqueName returns prefix + "_" + 12 random hex digits
// (svckit.UniqueName): with a prefix of lower-case letters, digits and
// underscores, a valid replication slot, database, exchange and queue name,
// so parallel tests and reruns against a shared broker never collide.
func UniqueName(prefix string) string { return svckit.UniqueName(prefix) }
