package publish

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The routing keys of a sinkRig's exchange: one a queue takes (acked), one
// a queue refuses (nacked), one no queue is bound to (returned, then acked).
const (
	keyAck     = "conform.ack"
	keyNack    = "conform.nack"
	keyNoRoute = "conform.noroute"
)

// sinkRig is a sink under test with the broker-side means to make it show
// each behaviour of runSinkConformance.
type sinkRig struct {
	sink     sink
	exchange string // routes keyAck, keyNack and keyNoRoute as their names say
	// closeLane makes the broker close lane i with a 404 channel exception.
	closeLane func(t *testing.T, i int)
	done      func(t *testing.T) // closes the sink and whatever the rig started
}

// conformWait bounds every wait of the suite.
const conformWait = 15 * time.Second

// runSinkConformance is what every sink must show for the core (sink.go)
// to be right on it: newRig builds a fresh sink of two lanes per case.
func runSinkConformance(t *testing.T, newRig func(t *testing.T, lanes int) sinkRig) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, r sinkRig)
	}{
		{"ConfirmsEveryPublishOnce", conformConfirms},
		{"Nack", conformNack},
		{"ReturnBeforeAck", conformReturnBeforeAck},
		{"Unencodable", conformUnencodable},
		{"ChannelCloseMidFlight", conformChannelClose},
		{"Abort", conformAbort},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, 2)
			defer r.done(t)
			if n := len(r.sink.lanes()); n != 2 {
				t.Fatalf("%d lanes, want 2", n)
			}
			tc.run(t, r)
		})
	}
}

// laneFor is the lane an event with key takes, as the publisher picks it.
func (r sinkRig) laneFor(key string) (int, sinkLane) {
	lanes := r.sink.lanes()
	i := LaneOf(key, len(lanes))
	return i, lanes[i]
}

// send publishes n persistent messages with key on its lane.
func (r sinkRig) send(t *testing.T, key string, n int) []confirmation {
	t.Helper()
	_, l := r.laneFor(key)
	var out []confirmation
	for i := range n {
		msg := Message{ID: fmt.Sprintf("%s-%d", key, i), Body: []byte("x"), Headers: conformHeaders}
		dc, err := l.publish(context.Background(), r.exchange, key, &msg)
		if err != nil {
			t.Fatalf("publish %s: %v", msg.ID, err)
		}
		out = append(out, dc)
	}
	return out
}

// conformHeaders are on every message the suite sends: each kind of header
// value the core builds (message.go), which a return must carry back as
// sent (returnKeyOf places a return by its headers).
var conformHeaders = Headers{
	HeaderCommitLSN: "0/16B3748", HeaderTxIndex: int64(4), "s": "x", "b": true,
	"d": Decimal{Scale: 2, Value: 1250}, "o": Headers{"l": []any{int64(1), nil, Decimal{Scale: 1, Value: -5}}},
}

// noReturn fails when l holds a return.
func noReturn(t *testing.T, l sinkLane, when string) {
	t.Helper()
	if ret, ok := l.nextReturn(); ok {
		t.Fatalf("%s: a return %+v", when, ret)
	}
}

// resolve waits for c's answer and reports whether it is an ack.
func resolve(t *testing.T, c confirmation) bool {
	t.Helper()
	select {
	case <-c.Done():
		return c.Acked()
	case <-time.After(conformWait):
		t.Fatal("a confirmation never resolved")
		return false
	}
}

// closedWithin waits for ch to be closed, discarding what it still holds.
func closedWithin[T any](t *testing.T, what string, ch <-chan T) {
	t.Helper()
	deadline := time.After(conformWait)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatalf("%s not closed", what)
		}
	}
}

// conformConfirms: every publish gets exactly one answer, an ack for a
// message a queue takes, and nothing is returned.
func conformConfirms(t *testing.T, r sinkRig) {
	_, l := r.laneFor(keyAck)
	for i, c := range r.send(t, keyAck, 50) {
		if !resolve(t, c) {
			t.Fatalf("message %d nacked", i)
		}
	}
	noReturn(t, l, "routable messages acked")
	if l.isClosed() || l.closeReason() != nil {
		t.Fatalf("lane closed after acks: %v", l.closeReason())
	}
}

// conformNack: a refused message is nacked, and the lane stays open and
// usable.
func conformNack(t *testing.T, r sinkRig) {
	_, l := r.laneFor(keyNack)
	for i, c := range r.send(t, keyNack, 3) {
		if resolve(t, c) {
			t.Fatalf("refused message %d acked", i)
		}
	}
	if l.isClosed() || l.closeReason() != nil {
		t.Fatalf("a nack closed the lane: %v", l.closeReason())
	}
	if c := r.send(t, keyAck, 1)[0]; !resolve(t, c) {
		t.Fatal("a message after the nacks was nacked")
	}
}

// conformReturnBeforeAck: an unroutable message is readable through
// nextReturn by the time its confirmation resolves (the returns book
// relies on it), with where it was sent and its headers as sent, then
// acked; nextReturn then holds nothing more.
func conformReturnBeforeAck(t *testing.T, r sinkRig) {
	_, l := r.laneFor(keyNoRoute)
	c := r.send(t, keyNoRoute, 1)[0]
	acked := resolve(t, c)
	ret, ok := l.nextReturn()
	if !ok {
		t.Fatal("the confirmation resolved before its return arrived")
	}
	if ret.MessageID != keyNoRoute+"-0" || ret.Code != amqp.NoRoute || ret.Exchange != r.exchange || ret.RoutingKey != keyNoRoute {
		t.Fatalf("return %+v", ret)
	}
	if !equal(ret.Headers, conformHeaders) {
		t.Fatalf("returned headers %#v, sent %#v", ret.Headers, conformHeaders)
	}
	if !acked {
		t.Fatal("a returned message was nacked")
	}
	noReturn(t, l, "the one return taken")
}

// conformUnencodable: a message the sink judges unsendable is one its
// publish cannot encode, and a publish failing for that says so with an
// *unencodable error (the row's fault, never the transport's); the lane
// stays usable after a value its library refuses before sending.
func conformUnencodable(t *testing.T, r sinkRig) {
	_, l := r.laneFor(keyAck)
	bad := Message{ID: "bad", Body: []byte("x"), Headers: Headers{"u": uint64(1)}}
	if why := r.sink.unsendable(r.exchange, keyAck, &bad); why == "" {
		t.Fatal("unsendable accepts a header value of a type the sink cannot encode")
	}
	good := Message{ID: "good", Body: []byte("x"), Headers: conformHeaders}
	if why := r.sink.unsendable(r.exchange, keyAck, &good); why != "" {
		t.Fatalf("unsendable refuses the core's own header values: %s", why)
	}
	_, err := l.publish(context.Background(), r.exchange, keyAck, &bad)
	var own *unencodable
	if !errors.As(err, &own) {
		t.Fatalf("publish of an unencodable message: %v, want an *unencodable error", err)
	}
	if c := r.send(t, keyAck, 1)[0]; !resolve(t, c) {
		t.Fatal("a message after the refused one was nacked")
	}
}

// conformChannelClose: the broker closing a lane mid-flight resolves every
// outstanding confirmation, with the reason readable at once as soon as
// any of them resolves unacked; closing then closes, no return is left,
// publishing fails, and the other lane is untouched.
func conformChannelClose(t *testing.T, r sinkRig) {
	i, l := r.laneFor(keyAck)
	pending := r.send(t, keyAck, 20)
	r.closeLane(t, i)
	for _, c := range pending {
		if !resolve(t, c) && l.closeReason() == nil {
			t.Fatal("a confirmation resolved unacked before the close reason was readable")
		}
	}
	select {
	case e := <-l.closing():
		if e == nil || e.kind != closeNoExchange || e.code != amqp.NotFound {
			t.Fatalf("closing gave %+v, want a 404: no exchange", e)
		}
	case <-time.After(conformWait):
		t.Fatal("closing never fired")
	}
	closedWithin(t, "closing", l.closing())
	noReturn(t, l, "lane closed")
	if e := l.closeReason(); e == nil || e.kind != closeNoExchange || !l.isClosed() {
		t.Fatalf("closeReason %+v, isClosed %v", e, l.isClosed())
	}
	if _, err := l.publish(context.Background(), r.exchange, keyAck, &Message{}); err == nil {
		t.Fatal("publish on a closed lane succeeded")
	}
	if other := r.sink.lanes()[1-i]; other.isClosed() {
		t.Fatal("closing one lane closed the other")
	}
}

// conformAbort: Abort ends the connection at once: it reports its closure,
// every lane closes, every outstanding confirmation resolves, and a
// publish fails; a second Abort is harmless.
func conformAbort(t *testing.T, r sinkRig) {
	pending := r.send(t, keyAck, 20)
	r.sink.Abort()
	closedWithin(t, "connClosed", r.sink.connClosed())
	for _, c := range pending {
		resolve(t, c)
	}
	for i, l := range r.sink.lanes() {
		closedWithin(t, fmt.Sprintf("lane %d closing", i), l.closing())
		noReturn(t, l, fmt.Sprintf("lane %d after Abort", i))
		if !l.isClosed() {
			t.Fatalf("lane %d open after Abort", i)
		}
		if _, err := l.publish(context.Background(), r.exchange, keyAck, &Message{}); err == nil {
			t.Fatalf("publish on lane %d after Abort succeeded", i)
		}
	}
	closedWithin(t, "flow", r.sink.flow())
	r.sink.Abort()
}
