package relaytest

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/migrations"
)

// Options choose a World's services.
type Options struct {
	PG testenv.PostgresOptions
	// AMQPURL is the broker; empty means the machine's shared broker
	// (testenv.RequireAMQP).
	AMQPURL string
	// Exchange and Queue prefix the unique names of the test's exchange
	// and consumer queue.
	Exchange, Queue string
	// Binding is the consumer's binding key ("#" when empty).
	Binding string
}

// World is one test's services: a throwaway cluster with a database "app"
// holding the outbox schema, an exchange and a consumer bound to it. The
// exchange is deleted when the test ends.
type World struct {
	PG       *testenv.Postgres
	DBURL    string // superuser, direct
	AMQPURL  string // direct
	Exchange string
	Consumer *testenv.Consumer
	DB       *pgx.Conn // the test's own connection, as superuser
}

// NewWorld starts the services o names for t.
func NewWorld(t *testing.T, o Options) *World {
	t.Helper()
	amqpURL := o.AMQPURL
	if amqpURL == "" {
		amqpURL = testenv.RequireAMQP(t)
	}
	pg := testenv.MustPostgres(t, o.PG)
	ctx := context.Background()
	if err := pg.CreateDatabase(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	w := &World{PG: pg, DBURL: pg.URL("app"), AMQPURL: amqpURL, Exchange: testenv.UniqueName(o.Exchange)}
	w.DB = Connect(t, w.DBURL)
	if err := migrations.Apply(ctx, w.DB); err != nil {
		t.Fatal(err)
	}
	binding := o.Binding
	if binding == "" {
		binding = "#"
	}
	w.Consumer = testenv.MustConsumer(t, amqpURL, w.Exchange, testenv.UniqueName(o.Queue), binding)
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = testenv.DeleteExchange(cctx, amqpURL, w.Exchange)
	})
	return w
}

// Connect opens a connection to url for t, closed when the test ends.
func Connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	db, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	return db
}

// BrokerHostPort is the host:port of an AMQP URL, for a proxy in front of
// the broker.
func BrokerHostPort(t testing.TB, amqpURL string) string {
	t.Helper()
	u, err := amqp.ParseURI(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
}
