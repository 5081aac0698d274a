package testenv

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/svckit"
	"github.com/cdcrelay/cdcrelay/internal/svckit/brokernode"
	"github.com/cdcrelay/cdcrelay/internal/svckit/netproxy"
)

// This file re-exports the service kit (internal/svckit) under the names
// the tests have always used, so that a test needs one import. The kit's
// packages document each name; the binaries import the kit directly, since
// this package links the testing package.

// AMQPURLEnv overrides the broker the tests and the demos use.
const AMQPURLEnv = brokernode.AMQPURLEnv

// DefaultAMQPURL is the shared local broker.
const DefaultAMQPURL = brokernode.DefaultAMQPURL

// Buffer collects a process's or a logger's output, safe for concurrent
// writes (svckit.Buffer).
type Buffer = svckit.Buffer

// Delivery is one message as the test consumer received it.
type Delivery = brokernode.Delivery

// Consumer records what a queue receives, across broker restarts
// (brokernode.Consumer).
type Consumer = brokernode.Consumer

// Proxy is a TCP proxy that injects network faults (netproxy.Proxy).
type Proxy = netproxy.Proxy

// CA is a throwaway certificate authority for TLS tests (netproxy.CA).
type CA = netproxy.CA

// TLSTerminator terminates TLS in front of a plain-text server
// (netproxy.TLSTerminator).
type TLSTerminator = netproxy.TLSTerminator

// AMQPURL is brokernode.AMQPURL: $CDCRELAY_TEST_AMQP_URL or the local broker.
func AMQPURL() string { return brokernode.AMQPURL() }

// AMQPAddr is brokernode.AMQPAddr: host:port of the shared broker.
func AMQPAddr() string { return brokernode.AMQPAddr() }

// CheckAMQP is brokernode.CheckAMQP.
func CheckAMQP(ctx context.Context, url string) error { return brokernode.CheckAMQP(ctx, url) }

// DialAMQP is brokernode.DialAMQP.
func DialAMQP(ctx context.Context, url string) (*amqp.Connection, error) {
	return brokernode.DialAMQP(ctx, url)
}

// DeclareExchange is brokernode.DeclareExchange.
func DeclareExchange(ctx context.Context, url, exchange string) error {
	return brokernode.DeclareExchange(ctx, url, exchange)
}

// DeleteExchange is brokernode.DeleteExchange.
func DeleteExchange(ctx context.Context, url, exchange string) error {
	return brokernode.DeleteExchange(ctx, url, exchange)
}

// DeleteQueue is brokernode.DeleteQueue.
func DeleteQueue(ctx context.Context, url, queue string) error {
	return brokernode.DeleteQueue(ctx, url, queue)
}

// NewConsumer is brokernode.NewConsumer: the caller must Close it. Tests
// use MustConsumer.
func NewConsumer(ctx context.Context, url, exchange, queue, bindingKey string) (*Consumer, error) {
	return brokernode.NewConsumer(ctx, url, exchange, queue, bindingKey)
}

// ReadStream is brokernode.ReadStream.
func ReadStream(ctx context.Context, url, queue string, n int, quiet time.Duration) ([]Delivery, error) {
	return brokernode.ReadStream(ctx, url, queue, n, quiet)
}

// NewProxy is netproxy.NewProxy. Tests use MustProxy.
func NewProxy(target string) (*Proxy, error) { return netproxy.NewProxy(target) }

// NewCA is netproxy.NewCA.
func NewCA(name string) (*CA, error) { return netproxy.NewCA(name) }

// WriteServerFiles is netproxy.WriteServerFiles.
func WriteServerFiles(files map[string][]byte) (string, error) {
	return netproxy.WriteServerFiles(files)
}

// NewTLSTerminator is netproxy.NewTLSTerminator.
func NewTLSTerminator(target string, certPEM, keyPEM []byte, clientCAs []byte) (*TLSTerminator, error) {
	return netproxy.NewTLSTerminator(target, certPEM, keyPEM, clientCAs)
}
