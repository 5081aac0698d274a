package inbox

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// These settle a delivery, count and log it. A failed ack or nack (the
// channel closed) only means the broker redelivers the message: the ledger
// then recognises it.

func (ib *Inbox) handled(d amqp.Delivery, handler string, order Order) (Result, error) {
	ib.metrics.handled.WithLabelValues(handler).Inc()
	if order == OrderLate {
		ib.metrics.late.WithLabelValues(handler).Inc()
	}
	if err := d.Ack(false); err != nil {
		return Handled, fmt.Errorf("inbox: ack %s after handling it (the copy the broker redelivers will be a duplicate): %w", d.MessageId, err)
	}
	return Handled, nil
}

func (ib *Inbox) duplicate(d amqp.Delivery, handler string) (Result, error) {
	ib.metrics.duplicates.WithLabelValues(handler).Inc()
	ib.log.Debug("inbox: duplicate delivery acked", "message_id", d.MessageId, "handler", handler, "redelivered", d.Redelivered)
	if err := d.Ack(false); err != nil {
		return Duplicate, fmt.Errorf("inbox: ack duplicate %s: %w", d.MessageId, err)
	}
	return Duplicate, nil
}

// handlerFailed nacks: with requeue for a Requeue error or when ctx ended
// (a consumer shutting down must not dead-letter what it was handling),
// else to the dead-letter exchange.
func (ib *Inbox) handlerFailed(ctx context.Context, d amqp.Delivery, handler string, err error) (Result, error) {
	ib.metrics.errors.WithLabelValues(handler).Inc()
	err = fmt.Errorf("inbox: handler %s failed on %s: %w", handler, d.MessageId, err)
	if wantsRequeue(err) || ctx.Err() != nil {
		return ib.requeue(d, handler, err)
	}
	return ib.reject(d, handler, err)
}

func (ib *Inbox) reject(d amqp.Delivery, handler string, err error) (Result, error) {
	ib.log.Warn("inbox: delivery nacked without requeue (to the dead-letter exchange, if the queue has one)",
		"message_id", d.MessageId, "handler", handler, "routing_key", d.RoutingKey, "error", err.Error())
	if nerr := d.Nack(false, false); nerr != nil {
		return Rejected, fmt.Errorf("%w (nack: %w)", err, nerr)
	}
	return Rejected, err
}

func (ib *Inbox) requeue(d amqp.Delivery, handler string, err error) (Result, error) {
	ib.log.Warn("inbox: delivery nacked with requeue",
		"message_id", d.MessageId, "handler", handler, "routing_key", d.RoutingKey, "error", err.Error())
	if nerr := d.Nack(false, true); nerr != nil {
		return Requeued, fmt.Errorf("%w (nack: %w)", err, nerr)
	}
	return Requeued, err
}
