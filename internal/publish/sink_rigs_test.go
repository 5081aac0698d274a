package publish

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestSinkConformanceFake: the model test's fake broker is a sink as the
// core needs one.
func TestSinkConformanceFake(t *testing.T) {
	runSinkConformance(t, fakeRig)
}

// TestIntegrationSinkConformanceAMQP: the AMQP link to RabbitMQ is a sink
// as the core needs one.
func TestIntegrationSinkConformanceAMQP(t *testing.T) {
	url := testenv.RequireAMQP(t)
	runSinkConformance(t, func(t *testing.T, lanes int) sinkRig { return amqpRig(t, url, lanes) })
}

// fakeRig is a fake broker that answers confirms in any order, one at a
// time or several at once, as a goroutine of its own.
func fakeRig(t *testing.T, lanes int) sinkRig {
	b := newFakeBroker(uint64(time.Now().UnixNano()), lanes)
	b.keyFates = map[string]fate{keyNack: fateNack, keyNoRoute: fateReturn}
	conn, s := b.connect(64)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			if !b.confirmOne(n%3 == 0) {
				time.Sleep(50 * time.Microsecond)
			}
		}
	})
	return sinkRig{
		sink: s, exchange: b.exchange,
		closeLane: func(_ *testing.T, i int) {
			b.mu.Lock()
			defer b.mu.Unlock()
			conn.chans[i].shutdown(&amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange 'gone'", Server: true})
		},
		done: func(t *testing.T) {
			close(stop)
			wg.Wait()
			b.closeConn(conn, nil, false)
			for _, p := range b.problems {
				t.Errorf("fake broker: %s", p)
			}
		},
	}
}

// amqpRig is a Link to RabbitMQ, with a throwaway exchange whose keyAck
// goes to a queue, keyNack to a queue that refuses every message
// (x-max-length 0, reject-publish) and keyNoRoute nowhere.
func amqpRig(t *testing.T, url string, lanes int) sinkRig {
	ctx, cancel := context.WithTimeout(context.Background(), conformWait)
	defer cancel()
	_, admin := testenv.MustChannel(t, url)
	exchange := testenv.UniqueName("cdcrelay.conform")
	if err := admin.ExchangeDeclare(exchange, "direct", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.ExchangeDelete(exchange, false, false) })
	for key, args := range map[string]amqp.Table{
		keyAck:  nil,
		keyNack: {"x-max-length": int32(0), "x-overflow": "reject-publish"},
	} {
		q, err := admin.QueueDeclare("", false, true, true, false, args)
		if err != nil {
			t.Fatal(err)
		}
		if err := admin.QueueBind(q.Name, key, exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	link, err := Dial(ctx, DialOptions{URL: url, Exchanges: []string{exchange}, Channels: lanes, Window: 64, Name: "cdcrelay sink conformance"})
	if err != nil {
		t.Fatal(err)
	}
	missing := testenv.UniqueName("cdcrelay.conform.missing")
	return sinkRig{
		sink: link, exchange: exchange,
		closeLane: func(t *testing.T, i int) {
			// A publish to an exchange that does not exist: the broker
			// closes the channel with a 404.
			if _, err := link.lanes()[i].publish(context.Background(), missing, "k", &Message{}); err != nil {
				t.Fatal(err)
			}
		},
		done: func(*testing.T) { _ = link.Close() },
	}
}

// TestClassifyClose: the AMQP adapter's reading of a close, which is all
// the core learns of it: a 406 refuses the message (and may name the
// broker's limit, a fact only a 406 states), a 404 names a missing
// exchange, any other code is no message's fault.
func TestClassifyClose(t *testing.T) {
	const tooBig = "PRECONDITION_FAILED - message size 300 is larger than configured max size 200"
	for _, c := range []struct {
		name  string
		e     *amqp.Error
		kind  closeKind
		limit int64
	}{
		{"406 with the limit", &amqp.Error{Code: amqp.PreconditionFailed, Reason: tooBig}, closeRefused, 200},
		{"406 for a header", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - invalid arg 'CC'"}, closeRefused, 0},
		{"404", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange 'x' in vhost '/'"}, closeNoExchange, 0},
		{"541 quoting a limit", &amqp.Error{Code: amqp.InternalError, Reason: tooBig}, closeOther, 0},
		{"connection forced", &amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED - shutdown"}, closeOther, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := classifyClose(c.e)
			if got.kind != c.kind || got.limit != c.limit || got.code != c.e.Code || got.reason != c.e.Reason || !errors.Is(got.err, c.e) {
				t.Fatalf("classifyClose(%v) = %+v", c.e, got)
			}
		})
	}
	if classifyClose(nil) != nil {
		t.Fatal("classifyClose(nil) is not nil")
	}
}
