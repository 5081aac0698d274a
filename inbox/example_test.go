package inbox_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/inbox"
)

// A billing service consumes the orders the relay publishes and books each
// one once, whatever RabbitMQ redelivers. The queue was declared with a
// dead-letter exchange, where poison messages go. The example is compiled
// by go test, not run: it needs the services.
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
	msgs, err := ch.Consume("billing.orders", "", false, false, false, false, nil)
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
				return // the channel closed: reconnect in a real service
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
