package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/svckit/brokernode"
)

const (
	// consumerPrefetch and consumerAckEvery keep the consumer out of the
	// way: it acks in batches (multiple=true), never per message.
	consumerPrefetch = 1000
	consumerAckEvery = 100
	consumerAckIdle  = 20 * time.Millisecond
)

// receipt is one delivery: the message id and when the consumer got it.
type receipt struct {
	id string
	at time.Time
}

// consumer records the message id and arrival time of everything routed to
// the bench queues; it keeps no bodies, so recording costs next to nothing
// next to the broker. Each queue has its own channel (and so its own
// prefetch window and delivery tags) on one connection. It does not
// reconnect: a broker failure fails the bench.
type consumer struct {
	conn  *amqp.Connection
	loops sync.WaitGroup // one loop per queue

	mu     sync.Mutex
	recs   []receipt
	failed error
}

// startConsumer consumes from every queue in queues, each on its own channel.
func startConsumer(ctx context.Context, url string, queues ...string) (*consumer, error) {
	conn, err := brokernode.DialAMQP(ctx, url)
	if err != nil {
		return nil, err
	}
	c := &consumer{conn: conn}
	for _, queue := range queues {
		ch, err := conn.Channel()
		if err == nil {
			// Per consumer (global false): global QoS is deprecated in
			// RabbitMQ 4.x and unsupported by quorum queues.
			err = ch.Qos(consumerPrefetch, 0, false)
		}
		var msgs <-chan amqp.Delivery
		if err == nil {
			msgs, err = ch.Consume(queue, "cdcrelay-bench", false, true, false, false, nil)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("consume %s: %w", queue, err), c.close())
		}
		c.loops.Add(1)
		go c.loop(ch, msgs)
	}
	return c, nil
}

func (c *consumer) loop(ch *amqp.Channel, msgs <-chan amqp.Delivery) {
	defer c.loops.Done()
	tick := time.NewTicker(consumerAckIdle)
	defer tick.Stop()
	var last uint64
	unacked := 0
	ack := func() {
		if unacked > 0 {
			if err := ch.Ack(last, true); err != nil {
				c.fail(fmt.Errorf("ack: %w", err))
			}
			unacked = 0
		}
	}
	for {
		select {
		case d, ok := <-msgs:
			if !ok {
				c.fail(errors.New("consumer channel closed"))
				return
			}
			at := time.Now()
			c.mu.Lock()
			c.recs = append(c.recs, receipt{d.MessageId, at})
			c.mu.Unlock()
			last = d.DeliveryTag
			if unacked++; unacked >= consumerAckEvery {
				ack()
			}
		case <-tick.C:
			ack()
		}
	}
}

func (c *consumer) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed == nil {
		c.failed = err
	}
}

// from returns the receipts from index i on.
func (c *consumer) from(i int) ([]receipt, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i >= len(c.recs) {
		return nil, c.failed
	}
	return append([]receipt(nil), c.recs[i:]...), c.failed
}

// reset forgets everything received so far; call it between phases, once
// the previous phase has all its messages.
func (c *consumer) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recs = nil
}

func (c *consumer) close() error {
	err := c.conn.Close()
	c.loops.Wait()
	return err
}

// arrival is what waitIDs learned about one phase's messages.
type arrival struct {
	at         map[string]time.Time // first arrival of each expected id
	last       time.Time            // when the last expected id first arrived
	first      time.Time
	duplicates int
	unexpected int
}

// waitIDs waits until every id in want has arrived at least once, or until
// ctx ends (then the error says how many are missing). It also fails early
// when stop is closed (the relay exited).
func (c *consumer) waitIDs(ctx context.Context, want map[string]struct{}, stop <-chan struct{}) (*arrival, error) {
	a := &arrival{at: make(map[string]time.Time, len(want))}
	next := 0
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		recs, err := c.from(next)
		if err != nil {
			return a, err
		}
		next += len(recs)
		for _, r := range recs {
			if _, ok := want[r.id]; !ok {
				a.unexpected++
				continue
			}
			if _, seen := a.at[r.id]; seen {
				a.duplicates++
				continue
			}
			a.at[r.id] = r.at
			if a.first.IsZero() || r.at.Before(a.first) {
				a.first = r.at
			}
			if r.at.After(a.last) {
				a.last = r.at
			}
		}
		if len(a.at) == len(want) {
			return a, nil
		}
		select {
		case <-ctx.Done():
			return a, fmt.Errorf("%d of %d messages arrived: %w", len(a.at), len(want), ctx.Err())
		case <-stop:
			return a, fmt.Errorf("%d of %d messages arrived: %w", len(a.at), len(want), errStopped)
		case <-tick.C:
		}
	}
}

// confirmPublisher is the reference publisher: one connection, one
// confirm-mode channel, at most window messages unconfirmed, published with
// mandatory and awaited in publish order, the way the relay's publisher
// does it (a FIFO of deferred confirmations).
type confirmPublisher struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	fifo    chan *amqp.DeferredConfirmation
	returns chan amqp.Return
	done    chan struct{}
	err     error // set before done is closed

	published int64        // publish calls; only the publishing goroutine
	confirmed atomic.Int64 // acks seen by the confirm loop
	progress  chan struct{}
}

func newConfirmPublisher(ctx context.Context, url string, window int) (*confirmPublisher, error) {
	conn, err := brokernode.DialAMQP(ctx, url)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("confirm channel: %w", err), conn.Close())
	}
	p := &confirmPublisher{
		conn: conn, ch: ch,
		// One message is awaited outside the FIFO, as in the relay.
		fifo:     make(chan *amqp.DeferredConfirmation, max(window-1, 1)),
		returns:  ch.NotifyReturn(make(chan amqp.Return, window)),
		done:     make(chan struct{}),
		progress: make(chan struct{}, 1),
	}
	go p.confirmLoop()
	return p, nil
}

func (p *confirmPublisher) confirmLoop() {
	defer close(p.done)
	for dc := range p.fifo {
		select {
		case <-dc.Done():
			if !dc.Acked() {
				p.err = errors.New("broker nacked a message")
				p.drain()
				return
			}
			p.confirmed.Add(1)
			select {
			case p.progress <- struct{}{}:
			default:
			}
		case r := <-p.returns:
			p.err = fmt.Errorf("broker returned message %s: %s", r.MessageId, r.ReplyText)
			p.drain()
			return
		}
	}
}

// drain empties the FIFO after a failure so publish never blocks on it.
func (p *confirmPublisher) drain() {
	go func() {
		for range p.fifo {
		}
	}()
}

// publish sends one message; it blocks while the window is full.
func (p *confirmPublisher) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	p.published++
	select {
	case p.fifo <- dc:
		return nil
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait returns once every message published so far is confirmed.
func (p *confirmPublisher) wait(ctx context.Context) error {
	for p.confirmed.Load() < p.published {
		select {
		case <-p.progress:
		case <-p.done:
			return p.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// finish waits for every confirm and closes the connection.
func (p *confirmPublisher) finish() error {
	close(p.fifo)
	<-p.done
	return errors.Join(p.err, p.conn.Close())
}

// benchMessage is a message shaped like the relay's (see
// internal/publish.Message): persistent, message_id, content type, type,
// commit timestamp and the relay's headers, including the traceparent it
// lifts from the payload's trace_context.
func benchMessage(id string, body []byte, traceparent string, index int) amqp.Publishing {
	return amqp.Publishing{
		Headers: amqp.Table{
			"cdcrelay-commit-lsn": "0/5A3C2F18",
			"cdcrelay-tx-index":   int64(index),
			"traceparent":         traceparent,
		},
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		MessageId:    id,
		Timestamp:    time.Now(),
		Type:         "OrderCreated",
		Body:         body,
	}
}

// benchID is a UUID-shaped message id (the relay's ids are the outbox's
// UUIDs), unique per run and message.
func benchID(run uint32, i int) string {
	return fmt.Sprintf("%08x-0000-4000-8000-%012x", run, i)
}
