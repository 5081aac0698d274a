package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/inbox"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// A billing service consumes the orders the relay publishes and books each
// one once, whatever RabbitMQ redelivers. The queue was declared with a
// dead-letter exchange, where poison messages go. Needing the services, the
// example has no output to check: TestIntegrationExample runs it against
// them.
func Example() {
	ctx := context.Background()
	logger := slog.Default()
	// A *pgxpool.Pool works too and lets several deliveries be handled at
	// once; a *pgx.Conn is used from one goroutine at a time.
	db, err := pgx.Connect(ctx, os.Getenv("BILLING_DATABASE_URL"))
	if err != nil {
		logger.Error("connect", "error", err.Error())
		return
	}
	defer func() { _ = db.Close(ctx) }()
	if err := inbox.Migrate(ctx, db); err != nil { // or apply inbox.Schema with your migration tool
		logger.Error("migrate", "error", err.Error())
		return
	}
	ib, err := inbox.New(db, inbox.Options{Logger: logger, Registerer: prometheus.DefaultRegisterer})
	if err != nil {
		logger.Error("inbox", "error", err.Error())
		return
	}

	conn, err := amqp.Dial(os.Getenv("AMQP_URL"))
	if err != nil {
		logger.Error("dial", "error", err.Error())
		return
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		logger.Error("channel", "error", err.Error())
		return
	}
	if err := ch.Qos(50, 0, false); err != nil {
		logger.Error("qos", "error", err.Error())
		return
	}
	// Manual acks (autoAck false): the inbox acks after the commit.
	msgs, err := ch.Consume(os.Getenv("BILLING_QUEUE"), "", false, false, false, false, nil)
	if err != nil {
		logger.Error("consume", "error", err.Error())
		return
	}

	book := func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		if ev.Order == inbox.OrderLate {
			// A newer event of this order was booked first (see
			// docs/messages.md): this one is new, but out of order.
			logger.Info("booking an order event out of order", "message_id", ev.MessageID)
		}
		_, err := tx.Exec(ctx, `INSERT INTO bookings (order_event, body) VALUES ($1, $2)`, ev.MessageID, ev.Delivery.Body)
		if errors.Is(err, context.DeadlineExceeded) {
			return inbox.Requeue(err) // not the message's fault: try it again
		}
		return err // any other error dead-letters the message
	}

	retention := time.NewTicker(time.Hour)
	defer retention.Stop()
	for {
		select {
		case d, ok := <-msgs:
			if !ok {
				return // the subscription ended: reconnect in a real service
			}
			// Handle settles the delivery (ack, or nack): the error is for
			// the log.
			if _, err := ib.Handle(ctx, d, "billing.book", book); err != nil {
				logger.Warn("order event not booked", "message_id", d.MessageId, "error", err.Error())
			}
		case <-retention.C:
			// Done rows older than a week: longer than any redelivery.
			if _, err := ib.Purge(ctx, 7*24*time.Hour); err != nil {
				logger.Warn("inbox retention", "error", err.Error())
			}
		}
	}
}

// TestIntegrationExample runs Example against the services: it books each
// order once, a copy included, and returns when its queue is deleted.
func TestIntegrationExample(t *testing.T) {
	e := setup(t)
	if _, err := e.conn.Exec(t.Context(), `CREATE TABLE bookings (order_event TEXT NOT NULL, body JSONB NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Setenv("BILLING_DATABASE_URL", e.dbURL)
	t.Setenv("AMQP_URL", e.amqpURL)
	t.Setenv("BILLING_QUEUE", e.queue)
	e.publish(t, "o1", "orders.1", "0/10", 0)
	e.publish(t, "o2", "orders.1", "0/10", 1)
	e.publish(t, "o1", "orders.1", "0/10", 0) // a copy
	done := make(chan struct{})
	go func() {
		defer close(done)
		Example()
	}()
	count := func() (n int) {
		if err := e.conn.QueryRow(t.Context(), `SELECT count(*) FROM cdcrelay_inbox WHERE state = 'done'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, 30*time.Second, "two orders booked and the queue empty", func() bool {
		return count() == 2 && e.messages(t, e.queue) == 0
	})
	// The copy was delivered after o2: once the queue is empty it has
	// been settled too.
	if err := testenv.DeleteQueue(t.Context(), e.amqpURL, e.queue); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Example did not return after its queue was deleted")
	}
	rows, err := e.conn.Query(t.Context(), `SELECT order_event, count(*) FROM bookings GROUP BY 1 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var id string
		var n int
		err := r.Scan(&id, &n)
		return fmt.Sprintf("%s:%d", id, n), err
	})
	if err != nil || strings.Join(got, " ") != "o1:1 o2:1" {
		t.Errorf("bookings %v (%v), want o1 and o2 once each", got, err)
	}
}
