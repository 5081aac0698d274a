package brokernode

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// streamPrefetch is the stream consumer's credit. A stream queue refuses a
// consumer without one (prefetch 0 means unlimited, which a stream cannot
// serve from its log), and acks only return credit: they remove nothing.
const streamPrefetch = 100

// DeclareStream declares a durable stream queue (x-queue-type stream,
// RabbitMQ 3.9+) bound to exchange with bindingKey. The exchange must
// exist. A stream is an append-only log: what ReadStream reads from it
// stays, so the reader sees every copy the broker took, duplicates
// included, in the order it appended them. A declare that worked and a
// bind that failed still leave a stream for the caller to delete.
func DeclareStream(ctx context.Context, url, exchange, queue, bindingKey string) error {
	return withChannel(ctx, url, func(ch *amqp.Channel) error {
		// Streams must be durable; RabbitMQ 4.3 also refuses any
		// non-durable non-exclusive queue.
		if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "stream"}); err != nil {
			return fmt.Errorf("declare stream %q: %w", queue, err)
		}
		if err := ch.QueueBind(queue, bindingKey, exchange, false, nil); err != nil {
			return fmt.Errorf("bind stream %q to %q with %q: %w", queue, exchange, bindingKey, err)
		}
		return nil
	})
}

// ReadStream reads the stream queue from its first offset over AMQP 0-9-1
// until it has received at least n messages and then nothing more for
// quiet, and returns them in stream order. A stream consumer never reaches
// an end (it waits for new appends), so quiet is what says the log is read:
// stop whatever publishes to the stream first. It fails when ctx ends
// before n messages arrived, saying how many did. The broker adds an
// x-stream-offset header (the message's offset in the log) to each.
func ReadStream(ctx context.Context, url, queue string, n int, quiet time.Duration) ([]Delivery, error) {
	conn, err := DialAMQP(ctx, url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.CloseDeadline(time.Now().Add(5 * time.Second)) }()
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(streamPrefetch, 0, false); err != nil {
		return nil, fmt.Errorf("set prefetch: %w", err)
	}
	// Manual ack: a stream refuses auto-ack consumers. "first" starts at
	// the oldest message the stream holds instead of the next one
	// appended (the default, "next").
	msgs, err := ch.Consume(queue, "", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
	if err != nil {
		return nil, fmt.Errorf("consume stream %q: %w", queue, err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	var got []Delivery
	timer := time.NewTimer(quiet)
	defer timer.Stop()
	for {
		select {
		case d, ok := <-msgs:
			if !ok {
				return got, fmt.Errorf("stream %q: channel ended after %d of %d messages: %w", queue, len(got), n, closeReason(closed))
			}
			got = append(got, deliveryOf(d))
			if err := d.Ack(false); err != nil {
				return got, fmt.Errorf("stream %q: ack: %w", queue, err)
			}
			timer.Reset(quiet)
		case <-timer.C:
			if len(got) >= n {
				return got, nil
			}
			timer.Reset(quiet)
		case <-ctx.Done():
			return got, fmt.Errorf("stream %q: %d of %d messages read: %w", queue, len(got), n, ctx.Err())
		}
	}
}

// closeReason is the error the broker closed the channel with, if it says
// within a second, else a plain "closed".
func closeReason(closed <-chan *amqp.Error) error {
	select {
	case e := <-closed:
		if e != nil {
			return e
		}
	case <-time.After(time.Second):
	}
	return errors.New("closed")
}

// deliveryOf is what the Consumer and ReadStream record of a delivery.
func deliveryOf(d amqp.Delivery) Delivery {
	return Delivery{
		MessageID:    d.MessageId,
		Exchange:     d.Exchange,
		RoutingKey:   d.RoutingKey,
		Type:         d.Type,
		ContentType:  d.ContentType,
		Headers:      maps.Clone(map[string]any(d.Headers)),
		Body:         d.Body,
		Timestamp:    d.Timestamp,
		ReceivedAt:   time.Now(),
		Redelivered:  d.Redelivered,
		DeliveryMode: d.DeliveryMode,
	}
}
