package brokernode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// AMQPURLEnv overrides the broker the tests and the demo use.
const AMQPURLEnv = "CDCRELAY_TEST_AMQP_URL"

// DefaultAMQPURL is a local RabbitMQ with its stock guest account.
const DefaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/"

// amqpHandshakeTimeout bounds TCP connect plus the AMQP handshake, so that a
// black-holed broker address fails fast instead of hanging a test.
const amqpHandshakeTimeout = 10 * time.Second

// AMQPURL returns $CDCRELAY_TEST_AMQP_URL, or DefaultAMQPURL.
func AMQPURL() string {
	if u := os.Getenv(AMQPURLEnv); u != "" {
		return u
	}
	return DefaultAMQPURL
}

// AMQPAddr is host:port of the shared broker (AMQPURL): what a test puts a
// proxy or a TLS terminator in front of.
func AMQPAddr() string { return brokerAddr(AMQPURL()) }

// CheckAMQP dials the broker and closes the connection again. The error tells
// a human how to fix it and never contains the password.
func CheckAMQP(ctx context.Context, url string) error {
	conn, err := DialAMQP(ctx, url)
	if err != nil {
		return err
	}
	if err := conn.Close(); err != nil {
		return fmt.Errorf("close RabbitMQ connection to %s: %w", brokerAddr(url), err)
	}
	return nil
}

// DialAMQP opens a connection whose TCP dial and handshake honour ctx (the
// connection itself outlives ctx). Errors name the broker without the
// password and suggest how to start it.
func DialAMQP(ctx context.Context, url string) (*amqp.Connection, error) {
	if _, err := amqp.ParseURI(url); err != nil {
		// The URL may carry a password: describe it, do not echo it.
		return nil, fmt.Errorf("invalid AMQP URL: %w", err)
	}
	conn, err := amqp.DialConfig(url, amqp.Config{
		Heartbeat: 5 * time.Second,
		Locale:    "en_US",
		Dial:      contextDialer(ctx),
		Properties: amqp.Table{
			"connection_name": "cdcrelay-testenv",
		},
	})
	var amqpErr *amqp.Error
	switch {
	case errors.As(err, &amqpErr):
		// The broker answered, so starting it is not the fix.
		return nil, fmt.Errorf("RabbitMQ at %s refused the connection (check user, password and vhost): %w", brokerAddr(url), err)
	case err != nil:
		return nil, fmt.Errorf("RabbitMQ not reachable at %s (start it with: rabbitmq-server -detached): %w", brokerAddr(url), err)
	}
	return conn, nil
}

// contextDialer mirrors amqp.DefaultDial (a deadline covers the handshake and
// is cleared by the library once the connection is open) but also stops when
// ctx is done.
func contextDialer(ctx context.Context) func(network, addr string) (net.Conn, error) {
	return func(network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: amqpHandshakeTimeout}
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		deadline := time.Now().Add(amqpHandshakeTimeout)
		if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
			deadline = dl
		}
		if err := conn.SetDeadline(deadline); err != nil {
			_ = conn.Close()
			return nil, err
		}
		return conn, nil
	}
}

// DeclareExchange declares a durable topic exchange (idempotent).
func DeclareExchange(ctx context.Context, url, exchange string) error {
	return withChannel(ctx, url, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %q: %w", exchange, err)
		}
		return nil
	})
}

// DeleteExchange deletes an exchange; deleting one that does not exist is
// not an error.
func DeleteExchange(ctx context.Context, url, exchange string) error {
	return withChannel(ctx, url, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDelete(exchange, false, false); err != nil {
			return fmt.Errorf("delete exchange %q: %w", exchange, err)
		}
		return nil
	})
}

// DeleteQueue deletes a queue and the messages in it; deleting one that does
// not exist is not an error.
func DeleteQueue(ctx context.Context, url, queue string) error {
	return withChannel(ctx, url, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
			return fmt.Errorf("delete queue %q: %w", queue, err)
		}
		return nil
	})
}

// withChannel runs fn on a fresh connection and channel and closes both.
func withChannel(ctx context.Context, url string, fn func(*amqp.Channel) error) error {
	conn, err := DialAMQP(ctx, url)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	return fn(ch)
}

// brokerAddr returns host:port of an AMQP URL, for messages that must not
// leak credentials.
func brokerAddr(url string) string {
	u, err := amqp.ParseURI(url)
	if err != nil {
		return "<invalid AMQP URL>"
	}
	return net.JoinHostPort(u.Host, fmt.Sprint(u.Port))
}
