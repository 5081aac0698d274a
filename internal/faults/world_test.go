package faults_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// worldOptions choose the services of one test.
type worldOptions struct {
	PG testenv.PostgresOptions
	// Broker is a private node; nil means the machine's shared broker.
	Broker *testenv.RabbitMQ
	// Binding is the consumer's binding key ("#" when empty).
	Binding string
	// PGProxy and AMQPProxy put a fault proxy between the relay and that
	// service. Test code (loader, consumer, checks) always goes direct.
	PGProxy, AMQPProxy bool
}

// world is one test's services: a throwaway cluster with the outbox schema,
// a broker exchange, a consumer bound to it and the optional fault proxies.
type world struct {
	t         *testing.T
	pg        *testenv.Postgres
	dbURL     string // direct
	amqpURL   string // direct
	exchange  string
	consumer  *testenv.Consumer
	db        *pgx.Conn
	pgProxy   *testenv.Proxy
	amqpProxy *testenv.Proxy
}

func newWorld(t *testing.T, o worldOptions) *world {
	t.Helper()
	ro := relaytest.Options{PG: o.PG, Exchange: "cdcrelay.faults", Queue: "cdcrelay.faults.q", Binding: o.Binding}
	if o.Broker != nil {
		ro.AMQPURL = o.Broker.URL()
	}
	rw := relaytest.NewWorld(t, ro)
	w := &world{t: t, pg: rw.PG, dbURL: rw.DBURL, amqpURL: rw.AMQPURL, exchange: rw.Exchange, consumer: rw.Consumer, db: rw.DB}
	if o.PGProxy {
		w.pgProxy = testenv.MustProxy(t, fmt.Sprintf("127.0.0.1:%d", w.pg.Port()))
	}
	if o.AMQPProxy {
		w.amqpProxy = testenv.MustProxy(t, relaytest.BrokerHostPort(t, w.amqpURL))
	}
	return w
}

// amqp runs fn on a channel to the test's broker (direct).
func (w *world) amqp(t *testing.T, fn func(*amqp.Channel) error) {
	t.Helper()
	_, ch := testenv.MustChannel(t, w.amqpURL)
	if err := fn(ch); err != nil {
		t.Fatal(err)
	}
}

// drain consumes and discards queue's messages until the test ends.
func (w *world) drain(t *testing.T, queue string) {
	t.Helper()
	_, ch := testenv.MustChannel(t, w.amqpURL)
	msgs, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range msgs {
		}
	}()
}

// relayDBURL is the database URL the relay uses (through the proxy if any).
func (w *world) relayDBURL() string {
	if w.pgProxy != nil {
		return fmt.Sprintf("postgres://postgres@%s/app?sslmode=disable", w.pgProxy.Addr())
	}
	return w.dbURL
}

// relayAMQPURL is the broker URL the relay uses (through the proxy if any).
func (w *world) relayAMQPURL() string {
	if w.amqpProxy != nil {
		return "amqp://guest:guest@" + w.amqpProxy.Addr() + "/"
	}
	return w.amqpURL
}

// vars is the relay's environment. Backoff is the product default (500ms
// doubling) capped at 5s instead of 30s to keep the tests short.
func (w *world) vars(extra map[string]string) map[string]string {
	return relaytest.Vars(w.relayDBURL(), w.relayAMQPURL(), w.exchange,
		map[string]string{"BACKOFF_MIN": "500ms", "BACKOFF_MAX": "5s", "LOG_LEVEL": "info"}, extra)
}
