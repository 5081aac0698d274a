package preflight

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/publish"
)

// checkMaxMessageSize names the finding about the broker's max_message_size.
const checkMaxMessageSize = "max_message_size"

// probeRoutingKeyPrefix starts the routing key of the probe message: with
// a random suffix it names no queue, so the default exchange drops the
// message and nothing is delivered to anyone.
const probeRoutingKeyPrefix = "cdcrelay-check-max-message-size-probe."

// checkBrokerMaxMessageSize learns whether the broker takes a message as
// large as CDCRELAY_MAX_MESSAGE_BYTES. AMQP has no way to ask for
// max_message_size, so it publishes one message whose body is exactly that
// size on a throwaway confirm channel, to the default exchange with a
// routing key that names no queue and mandatory unset: a message that fits
// is acked and dropped; one that does not closes the channel with 406
// PRECONDITION_FAILED naming the limit. RabbitMQ measures the body only,
// which is what the relay's limit measures too. The connection stays
// usable either way.
func checkBrokerMaxMessageSize(ctx context.Context, conn *amqp.Connection, cfg config.Config) Finding {
	size := int64(cfg.MaxMessageBytes)
	ch, err := conn.Channel()
	if err != nil {
		return Finding{Check: checkMaxMessageSize, Severity: Warn, Message: fmt.Sprintf("could not open a channel to probe the broker's max_message_size: %v", err),
			Remedy: "check the broker's channel limits and log"}
	}
	// The channel is this probe's own: a refusal closes it, not the
	// connection the other checks use.
	defer func() { _ = ch.Close() }()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Confirm(false); err != nil {
		return Finding{Check: checkMaxMessageSize, Severity: Warn, Message: fmt.Sprintf("could not put the probe channel in confirm mode: %v", err),
			Remedy: "check that the broker answers and retry"}
	}
	var suffix [8]byte
	_, _ = rand.Read(suffix[:])
	key := probeRoutingKeyPrefix + hex.EncodeToString(suffix[:])
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", key, false, false,
		amqp.Publishing{Body: make([]byte, size), ContentType: "application/octet-stream"})
	if err != nil {
		return probeFailed(size, err)
	}
	acked, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		return probeFailed(size, err)
	case acked:
		return Finding{Check: checkMaxMessageSize,
			Message: fmt.Sprintf("the broker takes a message of CDCRELAY_MAX_MESSAGE_BYTES (%d bytes)", size)}
	}
	// amqp091-go resolves an outstanding confirm as a nack when the
	// channel closes: the close says why.
	var cause *amqp.Error
	select {
	case cause = <-closed:
	case <-ctx.Done():
		return probeFailed(size, ctx.Err())
	}
	if cause == nil {
		return probeFailed(size, errors.New("the broker nacked the probe message"))
	}
	if limit, ok := publish.BrokerMaxMessageSize(cause.Reason); ok {
		return Finding{Check: checkMaxMessageSize, Severity: Warn,
			Message: fmt.Sprintf("CDCRELAY_MAX_MESSAGE_BYTES (%d) is above the broker's max_message_size (%d): rows between %d and %d bytes are refused by the broker", size, limit, limit, size),
			Remedy:  fmt.Sprintf("set CDCRELAY_MAX_MESSAGE_BYTES to at most %d (larger rows are then parked as poison), or raise max_message_size in rabbitmq.conf", limit)}
	}
	if cause.Code == amqp.AccessRefused {
		return Finding{Check: checkMaxMessageSize,
			Message: fmt.Sprintf("could not probe the broker's max_message_size (no write permission on the default exchange: %s); not checked", cause.Reason),
			Remedy:  "to check it, grant the user write permission on amq.default, or compare CDCRELAY_MAX_MESSAGE_BYTES with max_message_size in rabbitmq.conf by hand"}
	}
	return probeFailed(size, cause)
}

// probeFailed is the finding for a probe that ended without a verdict.
func probeFailed(size int64, err error) Finding {
	return Finding{Check: checkMaxMessageSize, Severity: Warn,
		Message: fmt.Sprintf("could not probe whether the broker takes a message of CDCRELAY_MAX_MESSAGE_BYTES (%d bytes): %v", size, err),
		Remedy:  "compare CDCRELAY_MAX_MESSAGE_BYTES with max_message_size in rabbitmq.conf (16 MiB by default on RabbitMQ 4, 128 MiB on 3.x), or retry"}
}
