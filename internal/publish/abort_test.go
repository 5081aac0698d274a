package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// These tests put the link in the state a broker under a memory alarm
// leaves it in once the unconfirmed bytes exceed the socket buffers: the
// broker stops reading (and, the connection being blocked, stops checking
// its heartbeats), a publish blocks in
// the socket write while amqp091-go holds its channel and send locks, and
// amqp091-go's own shutdown waits for those locks. Whatever ends the
// pipeline must still end it within its deadline, leaving no goroutine
// behind.

// blockedBroker starts a private broker node with an exchange bound to a
// queue (no returns: every message is routable) and raises its memory
// alarm; the node is unblocked and stopped when the test ends.
func blockedBroker(t *testing.T) (rmq *testenv.RabbitMQ, exchange string) {
	t.Helper()
	rmq = testenv.MustRabbitMQ(t, testenv.RabbitMQOptions{})
	exchange = testenv.UniqueName("cdcrelay.abort")
	// A connection of its own, closed before the test: the goroutine checks
	// must find no amqp091-go goroutine but the link's.
	conn, err := testenv.DialAMQP(context.Background(), rmq.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("abort-test", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := rmq.SetMemoryHighWatermark(ctx, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rmq.SetMemoryHighWatermark(context.Background(), 0.4); err != nil {
			t.Logf("clear the memory alarm: %v", err)
		}
	})
	return rmq, exchange
}

// freeze makes a blocked broker silent as well (a hung node): it sends no
// heartbeat, so amqp091-go gives up on the connection after three of them.
// A broker that is only blocked keeps sending heartbeats, and the link
// keeps waiting for it (coalesce.Conn moves the read deadline). The node is
// thawed before the test's other clean-ups, which need it answering.
func freeze(t *testing.T, rmq *testenv.RabbitMQ) {
	t.Helper()
	if err := rmq.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rmq.Thaw(); err != nil {
			t.Errorf("thaw the broker: %v", err)
		}
	})
}

// stuckLink dials a broker whose memory alarm is raised: it stops reading
// the connection at its first publish.
func stuckLink(t *testing.T, nodeURL string, heartbeat time.Duration) *Link {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := Dial(ctx, DialOptions{URL: nodeURL, Heartbeat: heartbeat, Name: "cdcrelay abort test", Window: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Bounded, so that a Close that hangs fails the test instead of
		// hanging the test binary.
		if _, ok := closeBounded(l, 10*time.Second); !ok {
			t.Errorf("Close still running after 10s:\n%s", stackOf("amqp091-go"))
		}
	})
	return l
}

type discardAcks struct{}

func (discardAcks) Ack(Ref)            {}
func (discardAcks) Parked(Ref, string) {}
func (discardAcks) Resumed(Ref)        {}
func (discardAcks) Ending()            {}

// startStuckPublisher runs a publisher on l with an endless supply of
// 256 KiB events and returns once one of its publishes is blocked in the
// socket write. Run's result arrives on the returned channel.
func startStuckPublisher(t *testing.T, ctx context.Context, l *Link, exchange string) <-chan error {
	t.Helper()
	in := make(chan wal.Event)
	feedCtx, stopFeed := context.WithCancel(context.Background())
	t.Cleanup(stopFeed)
	budget := semaphore.NewWeighted(1 << 30)
	go abortTestFeed(feedCtx, in, budget)
	p := NewPublisher(l, in, discardAcks{}, budget, PublisherConfig{
		Exchange:    exchange,
		MaxInFlight: 1000, MaxInFlightBytes: 1 << 30, ConfirmTimeout: time.Minute, MaxMessageBytes: 1 << 20,
		Log:     slog.New(slog.DiscardHandler),
		Metrics: NewMetrics(prometheus.NewRegistry(), ""),
	})
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	// Blocked for good, not just behind a burst: the same publish stays in
	// the socket write for a second.
	deadline := time.Now().Add(60 * time.Second)
	var since time.Time
	for {
		stack := stackOf("(*Publisher).publish(")
		switch {
		case !strings.Contains(stack, "coalesce.(*Conn).Write("):
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
		case time.Since(since) > time.Second:
			return done
		}
		select {
		case err := <-done:
			t.Fatalf("publisher ended before its socket filled: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no publish blocked in the socket write after 60s:\n%s", allStacks())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// abortTestFeed sends 256 KiB events until ctx ends, taking each one's
// weight from budget first as the WAL reader does.
func abortTestFeed(ctx context.Context, in chan<- wal.Event, budget *semaphore.Weighted) {
	payload := []byte(`{"pad": "` + strings.Repeat("x", 256<<10) + `"}`)
	for i := 1; ; i++ {
		ev := wal.Event{ID: fmt.Sprintf("abort-test-%d", i), RoutingKey: "abort.test", Payload: payload, PayloadIsJSON: true, Seq: uint64(i)}
		if budget.Acquire(ctx, ev.Weight(1<<30)) != nil {
			return
		}
		select {
		case in <- ev:
		case <-ctx.Done():
			return
		}
	}
}

// TestIntegrationPublisherFailureAbortsAStuckSocket: a publish is stuck in
// the socket write of a blocked broker, which then hangs: amqp091-go gives
// up on the connection when heartbeats stop, which fails the publisher;
// the publisher must then return without waiting for the broker to read
// again.
func TestIntegrationPublisherFailureAbortsAStuckSocket(t *testing.T) {
	rmq, exchange := blockedBroker(t)
	l := stuckLink(t, rmq.URL(), time.Second)
	done := startStuckPublisher(t, context.Background(), l, exchange)
	freeze(t, rmq)
	blocked := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("Run: %v, want ErrClosed", err)
		}
		t.Logf("Run returned %s after the publish blocked: %v", time.Since(blocked).Round(time.Millisecond), err)
	case <-time.After(30 * time.Second):
		t.Fatalf("Run still blocked 30s after the connection failed (heartbeat 1s):\n%s", allStacks())
	}
	closeWithin(t, l, 5*time.Second)
	noLinkGoroutines(t)
}

// TestIntegrationLinkCloseAbortsAStuckSocket: the pipeline is stopped (its context
// ended: the publisher leaves the deadline to its caller) and amqp091-go
// has already begun shutting the connection down, so its close handshake
// returns at once without closing anything. Close must still end the
// connection, which lets the publisher return.
func TestIntegrationLinkCloseAbortsAStuckSocket(t *testing.T) {
	rmq, exchange := blockedBroker(t)
	l := stuckLink(t, rmq.URL(), time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := startStuckPublisher(t, ctx, l, exchange)
	freeze(t, rmq)
	cancel()
	waitUntil(t, 30*time.Second, "amqp091-go to start its shutdown", l.Conn.IsClosed)
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) before Close; the test would prove nothing", err)
	case <-time.After(500 * time.Millisecond):
	}
	closeWithin(t, l, 5*time.Second)
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Run returned nil after its connection was closed under it")
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Run still blocked 10s after Close:\n%s", allStacks())
	}
	noLinkGoroutines(t)
}

func closeWithin(t *testing.T, l *Link, within time.Duration) {
	t.Helper()
	took, ok := closeBounded(l, within)
	if !ok {
		t.Fatalf("Close still running after %s:\n%s", within, allStacks())
	}
	t.Logf("Close took %s", took.Round(time.Millisecond))
}

// closeBounded closes l, waiting at most within; ok is false if Close is
// still running then (it goes on in the background).
func closeBounded(l *Link, within time.Duration) (took time.Duration, ok bool) {
	start := time.Now()
	closed := make(chan struct{})
	go func() {
		_ = l.Close()
		close(closed)
	}()
	select {
	case <-closed:
		return time.Since(start), true
	case <-time.After(within):
		return within, false
	}
}

// noLinkGoroutines checks, from a goroutine dump, that nothing of the link
// or the publisher is left running or blocked.
func noLinkGoroutines(t *testing.T) {
	t.Helper()
	leftover := func() string {
		var out []string
		for _, g := range strings.Split(allStacks(), "\n\n") {
			if strings.Contains(g, "amqp091-go") || strings.Contains(g, "internal/coalesce") || strings.Contains(g, "publish.(*Publisher)") {
				out = append(out, g)
			}
		}
		return strings.Join(out, "\n\n")
	}
	waitUntil(t, 10*time.Second, "no goroutine of the link left", func() bool { return leftover() == "" })
}

func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s:\n%s", within, what, allStacks())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func allStacks() string {
	buf := make([]byte, 4<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// stackOf returns the stacks of the goroutines whose stack mentions fn.
func stackOf(fn string) string {
	var out []string
	for _, g := range strings.Split(allStacks(), "\n\n") {
		if strings.Contains(g, fn) {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
