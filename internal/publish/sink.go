package publish

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
)

// sink is the broker as the publishing core sees it, and the only way the
// core reaches it: the core (publisher.go, confirm.go, drain.go, abort.go,
// returns.go, poison.go) never holds a connection or a channel, only a sink
// and its lanes. *Link (link.go) is the AMQP sink; the fake broker of the
// model test is another. A new sink implements sink and sinkLane with the
// guarantees written on each method, and passes runSinkConformance
// (sink_conformance_test.go), which both sinks run.
//
// Why a lane or the connection closed crosses the seam already classified
// (closure): the core never reads a broker's close codes. The other values
// that cross it are still amqp091-go's (Publishing, Return, Blocking).
type sink interface {
	// lanes are the sink's ordered lanes, at least one, fixed for its life.
	lanes() []sinkLane
	// connClosed receives the connection's closure reason, if any, and is
	// then closed; every lane is closed by then or soon after.
	connClosed() <-chan *closure
	// blocked receives flow-control notifications (a broker resource
	// alarm); it is closed with the connection.
	blocked() <-chan amqp.Blocking
	// frameMax is the negotiated frame size, 0 if unknown.
	frameMax() int
	// Abort ends the connection now, whatever a publish is blocked in:
	// safe from any goroutine, more than once.
	Abort()
}

// sinkLane is one ordered, confirmed lane of a sink (an AMQP confirm-mode
// channel). Its guarantees are what the confirm loop relies on:
//   - every publish that returns no error gets a confirmation that resolves
//     exactly once: acked, nacked, or (the lane closing) not acked;
//   - a message the broker cannot route is handed to returns before its
//     confirmation resolves (so returns must be the sink's own channel,
//     never a copy forwarded by a goroutine, which could lag behind);
//   - when the lane closes, its reason (if any) is readable through
//     closeReason before returns is closed and before the outstanding
//     confirmations resolve as not acked;
//   - closing says so only once every answer the broker sent before the
//     close has resolved its confirmation (a late copy is fine: handOver
//     only needs the acks before the close to be in);
//   - publishing on a closed lane fails at once.
type sinkLane interface {
	// publish sends msg as a mandatory message: one the broker returns
	// when no queue takes it.
	publish(ctx context.Context, exchange, key string, msg amqp.Publishing) (confirmation, error)
	isClosed() bool
	// returns receives the lane's returned messages; closed with the lane.
	returns() <-chan amqp.Return
	// closing receives the lane's closure reason, if any, then is closed.
	closing() <-chan *closure
	// closeReason is why the broker closed the lane, nil when it did not
	// (or not yet); it never waits.
	closeReason() *closure
}

// closure is why the broker closed a lane or the connection, as the sink
// classifies it: the core blames a message (returns.go, blame) by kind
// alone.
type closure struct {
	kind   closeKind
	code   int    // the broker's own code, for the error text
	reason string // the broker's own text
	limit  int64  // the broker's max message size, when a refusal names it; else 0
	err    error  // the broker's error value, which errors.As finds in the session's error
}

// closeKind is what a closure says about the message in flight.
type closeKind int

// The close kinds.
const (
	// closeOther: the broker's own trouble (an internal error, a node going
	// down): no message is to blame.
	closeOther closeKind = iota
	// closeRefused: the broker refused the message in flight (a header it
	// rejects, a body above its limit): AMQP's 406.
	closeRefused
	// closeNoExchange: the message named an exchange that does not exist:
	// AMQP's 404.
	closeNoExchange
)

// confirmation is the broker's answer to one publish, as
// *amqp.DeferredConfirmation gives it: Done is closed once the message is
// acked or nacked, or its lane closed (then Acked is false).
type confirmation interface {
	Done() <-chan struct{}
	Acked() bool
}
