package publish

import (
	"context"
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
		msg := amqp.Publishing{MessageId: fmt.Sprintf("%s-%d", key, i), DeliveryMode: amqp.Persistent, Body: []byte("x")}
		dc, err := l.publish(context.Background(), r.exchange, key, msg)
		if err != nil {
			t.Fatalf("publish %s: %v", msg.MessageId, err)
		}
		out = append(out, dc)
	}
	return out
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
	select {
	case ret := <-l.returns():
		t.Fatalf("a routable message was returned: %+v", ret)
	default:
	}
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

// conformReturnBeforeAck: an unroutable message is on returns by the time
// its confirmation resolves (the returns book relies on it), then acked.
func conformReturnBeforeAck(t *testing.T, r sinkRig) {
	_, l := r.laneFor(keyNoRoute)
	c := r.send(t, keyNoRoute, 1)[0]
	acked := resolve(t, c)
	select {
	case ret := <-l.returns():
		if ret.MessageId != keyNoRoute+"-0" || ret.ReplyCode != amqp.NoRoute {
			t.Fatalf("return %q code %d", ret.MessageId, ret.ReplyCode)
		}
	default:
		t.Fatal("the confirmation resolved before its return arrived")
	}
	if !acked {
		t.Fatal("a returned message was nacked")
	}
}

// conformChannelClose: the broker closing a lane mid-flight resolves every
// outstanding confirmation, with the reason readable at once as soon as
// any of them resolves unacked; closing and returns then close, publishing
// fails, and the other lane is untouched.
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
	closedWithin(t, "returns", l.returns())
	if e := l.closeReason(); e == nil || e.kind != closeNoExchange || !l.isClosed() {
		t.Fatalf("closeReason %+v, isClosed %v", e, l.isClosed())
	}
	if _, err := l.publish(context.Background(), r.exchange, keyAck, amqp.Publishing{}); err == nil {
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
		closedWithin(t, fmt.Sprintf("lane %d returns", i), l.returns())
		if !l.isClosed() {
			t.Fatalf("lane %d open after Abort", i)
		}
		if _, err := l.publish(context.Background(), r.exchange, keyAck, amqp.Publishing{}); err == nil {
			t.Fatalf("publish on lane %d after Abort succeeded", i)
		}
	}
	closedWithin(t, "blocked", r.sink.blocked())
	r.sink.Abort()
}
