package publish

import "context"

// sink is the broker as the publishing core sees it, and the only way the
// core reaches it: the core (publisher.go, confirm.go, drain.go, abort.go,
// returns.go, poison.go) never holds a connection or a channel, only a sink
// and its lanes. *Link (link.go) is the AMQP sink; the fake broker of the
// model test is another. A new sink implements sink and sinkLane with the
// guarantees written on each method, and passes runSinkConformance
// (sink_conformance_test.go), which both sinks run.
//
// Nothing that crosses the seam is a broker's own type: the core hands a
// sink a Message (message.go) and gets back a Returned, a Flow, a closure
// already classified (the core never reads a broker's close codes) and a
// confirmation. Which messages a broker can encode is the sink's to say
// (unsendable), as is which publish failures are the message's fault
// (an *unencodable error). TestCoreSpeaksNoAMQP keeps the core's files
// free of amqp091-go.
type sink interface {
	// lanes are the sink's ordered lanes, at least one, fixed for its life.
	lanes() []sinkLane
	// connClosed receives the connection's closure reason, if any, and is
	// then closed; every lane is closed by then or soon after.
	connClosed() <-chan *closure
	// flow receives flow-control notifications (a broker resource
	// alarm); it is closed with the connection.
	flow() <-chan Flow
	// unsendable says why msg, published to exchange with routing key
	// key, can never be sent on this sink ("" when it can): a message it
	// accepts fails to publish only for the transport's sake, never its
	// own (the fate table's causeContent against causeTransport, fate.go).
	unsendable(exchange, key string, msg *Message) string
	// Abort ends the connection now, whatever a publish is blocked in:
	// safe from any goroutine, more than once.
	Abort()
}

// sinkLane is one ordered, confirmed lane of a sink (an AMQP confirm-mode
// channel). Its guarantees are what the confirm loop relies on:
//   - every publish that returns no error gets a confirmation that resolves
//     exactly once: acked, nacked, or (the lane closing) not acked;
//   - a message the broker cannot route is readable through nextReturn
//     before its confirmation resolves (so nextReturn reads what the
//     client library itself filled, never a copy forwarded by a
//     goroutine, which could lag behind);
//   - when the lane closes, its reason (if any) is readable through
//     closeReason before the outstanding confirmations resolve as not
//     acked;
//   - closing says so only once every answer the broker sent before the
//     close has resolved its confirmation (a late copy is fine: handOver
//     only needs the acks before the close to be in);
//   - publishing on a closed lane fails at once.
type sinkLane interface {
	// publish sends msg as a mandatory, persistent message: one the
	// broker returns when no queue takes it, and keeps on disk. A
	// failure that is the message's own (the client library could not
	// encode it) is an *unencodable error; any other is the transport's.
	publish(ctx context.Context, exchange, key string, msg *Message) (confirmation, error)
	isClosed() bool
	// nextReturn takes the oldest returned message the lane holds,
	// without waiting; ok is false when it holds none.
	nextReturn() (r Returned, ok bool)
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

// Returned is a message the broker could not route and handed back: where
// it was sent, the broker's code and text, and its id and headers, by
// which the core finds the event it carried (returnKeyOf).
type Returned struct {
	Exchange   string
	RoutingKey string
	Code       int
	Reason     string
	MessageID  string
	Headers    Headers
}

// Flow is a flow-control notification: the broker stopped taking
// publishes (Blocked, with its reason, a resource alarm) or took them up
// again.
type Flow struct {
	Blocked bool
	Reason  string
}

// unencodable is a publish that failed because the sink could not encode
// the message, the row's content, not the transport: the session ends and
// the next one parks the event (publishError, Refusals).
type unencodable struct{ err error }

func (e *unencodable) Error() string { return e.err.Error() }
func (e *unencodable) Unwrap() error { return e.err }

// confirmation is the broker's answer to one publish, as
// *amqp.DeferredConfirmation gives it: Done is closed once the message is
// acked or nacked, or its lane closed (then Acked is false).
type confirmation interface {
	Done() <-chan struct{}
	Acked() bool
}
