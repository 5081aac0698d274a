package brokernode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// consumerPrefetch bounds unacknowledged deliveries. Acking manually (after
// the delivery is recorded) means a connection drop redelivers what was in
// flight instead of losing it, as auto-ack would.
const consumerPrefetch = 500

const (
	reconnectMinBackoff = 100 * time.Millisecond
	reconnectMaxBackoff = 2 * time.Second
	// closeTimeout bounds the best-effort queue deletion in Close.
	closeTimeout = 10 * time.Second
)

// Delivery is one message as the test consumer received it.
type Delivery struct {
	MessageID    string
	Exchange     string
	RoutingKey   string
	Type         string
	ContentType  string
	Headers      map[string]any
	Body         []byte
	Timestamp    time.Time // the publisher's AMQP timestamp property (zero if unset)
	ReceivedAt   time.Time // when this consumer got it
	Redelivered  bool      // the broker delivered it before (e.g. to us, before a reconnect)
	DeliveryMode uint8     // 2 = persistent
}

// Consumer records every message routed to its durable queue, in arrival
// order, and reconnects on its own when the broker connection drops.
type Consumer struct {
	url, exchange, queue, bindingKey string
	// nodes, when set, are the cluster nodes' URLs the consumer connects
	// through in turn, starting with url's, and args the queue's
	// arguments (a quorum queue's x-queue-type): see
	// RabbitMQCluster.NewConsumer.
	nodes    []string
	args     amqp.Table
	attempts int // connections tried, to pick the next node; run's goroutine only

	cancel context.CancelFunc
	done   chan struct{}

	mu         sync.Mutex
	deliveries []Delivery
	changed    chan struct{} // closed and replaced whenever deliveries grows
	reconnects int
	closed     bool
}

// consumerSession is one live connection with its consuming channel.
type consumerSession struct {
	conn *amqp.Connection
	msgs <-chan amqp.Delivery
}

// NewConsumer declares a durable topic exchange, a durable queue bound to it
// with bindingKey ("#" for everything) and starts consuming into memory. ctx
// bounds only the initial setup; the consumer runs until Close.
func NewConsumer(ctx context.Context, url, exchange, queue, bindingKey string) (*Consumer, error) {
	return startConsumer(ctx, &Consumer{url: url, exchange: exchange, queue: queue, bindingKey: bindingKey})
}

// startConsumer connects c and starts consuming.
func startConsumer(ctx context.Context, c *Consumer) (*Consumer, error) {
	c.done, c.changed = make(chan struct{}), make(chan struct{})
	// Connect synchronously so setup errors reach the caller and anything
	// published after NewConsumer returns is routed to the queue.
	sess, err := c.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("new consumer on queue %q: %w", c.queue, err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.run(runCtx, sess)
	return c, nil
}

// Deliveries returns a copy of everything received so far, in arrival order.
// Bodies and header maps are shared with the consumer and must not be
// modified.
func (c *Consumer) Deliveries() []Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Delivery(nil), c.deliveries...)
}

// DeliveriesFrom returns a copy of the deliveries from index i on (empty if
// there are none yet), so a caller can follow arrivals without copying the
// whole history each time.
func (c *Consumer) DeliveriesFrom(i int) []Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i >= len(c.deliveries) {
		return nil
	}
	return append([]Delivery(nil), c.deliveries[max(i, 0):]...)
}

// Count is the number of deliveries received so far. Redeliveries count
// again: after a reconnect the broker redelivers what we had not acked yet
// (Redelivered is set), so compare message ids when duplicates matter.
func (c *Consumer) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.deliveries)
}

// Reconnects counts how often the consumer had to re-establish its connection.
func (c *Consumer) Reconnects() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reconnects
}

// WaitCount blocks until at least n deliveries have arrived or ctx is done.
func (c *Consumer) WaitCount(ctx context.Context, n int) error {
	err := c.WaitFor(ctx, func(ds []Delivery) bool { return len(ds) >= n })
	if err != nil {
		return fmt.Errorf("queue %q: %d of %d deliveries arrived: %w", c.queue, c.Count(), n, ctx.Err())
	}
	return nil
}

// WaitFor blocks until cond holds for the deliveries so far, or ctx is done.
// cond is called with the consumer's lock held and must not keep the slice
// or call the consumer.
func (c *Consumer) WaitFor(ctx context.Context, cond func([]Delivery) bool) error {
	for {
		c.mu.Lock()
		ok, changed := cond(c.deliveries), c.changed
		c.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("queue %q: condition not met after %d deliveries: %w", c.queue, c.Count(), ctx.Err())
		case <-changed:
		}
	}
}

// Close stops consuming and deletes the queue (best effort: the error is
// returned but the consumer is stopped either way). Calling it twice is a
// no-op.
func (c *Consumer) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()

	c.cancel()
	<-c.done
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if err := DeleteQueue(ctx, c.url, c.queue); err != nil {
		return fmt.Errorf("close consumer: %w", err)
	}
	return nil
}

// run consumes until ctx is cancelled, reconnecting whenever the session
// ends. The queue is durable, so messages routed while we are away wait.
func (c *Consumer) run(ctx context.Context, sess *consumerSession) {
	defer close(c.done)
	for sess != nil {
		c.drain(ctx, sess)
		_ = sess.conn.Close()
		if ctx.Err() != nil {
			return
		}
		sess = c.reconnect(ctx)
	}
}

// drain records deliveries until the channel closes (connection lost) or ctx
// is cancelled.
func (c *Consumer) drain(ctx context.Context, sess *consumerSession) {
	for {
		select {
		case <-ctx.Done():
			return
		case d, ok := <-sess.msgs:
			if !ok {
				return
			}
			c.record(d)
			// Ack only after recording; a lost ack means a redelivery, which
			// the record shows as Redelivered, never a silent loss.
			_ = d.Ack(false)
		}
	}
}

func (c *Consumer) record(d amqp.Delivery) {
	rec := deliveryOf(d)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deliveries = append(c.deliveries, rec)
	close(c.changed)
	c.changed = make(chan struct{})
}

// reconnect retries connect with capped exponential backoff until it works
// or ctx is cancelled (then it returns nil).
func (c *Consumer) reconnect(ctx context.Context) *consumerSession {
	backoff := reconnectMinBackoff
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		attemptCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		sess, err := c.connect(attemptCtx)
		cancel()
		if err == nil {
			c.mu.Lock()
			c.reconnects++
			c.mu.Unlock()
			return sess
		}
		backoff = min(backoff*2, reconnectMaxBackoff)
	}
}

// connect dials, (re)declares the topology and starts consuming. Declaring
// again on every reconnect is harmless (declarations are idempotent) and
// recreates anything a broker reset lost.
func (c *Consumer) connect(ctx context.Context) (*consumerSession, error) {
	url := c.url
	if len(c.nodes) > 0 {
		// A dead node is left for the next one at the next attempt.
		url = c.nodes[c.attempts%len(c.nodes)]
		c.attempts++
	}
	conn, err := DialAMQP(ctx, url)
	if err != nil {
		return nil, err
	}
	msgs, err := c.setup(conn)
	if err != nil {
		return nil, errors.Join(err, conn.Close())
	}
	return &consumerSession{conn: conn, msgs: msgs}, nil
}

func (c *Consumer) setup(conn *amqp.Connection) (<-chan amqp.Delivery, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.ExchangeDeclare(c.exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("declare exchange %q: %w", c.exchange, err)
	}
	if _, err := ch.QueueDeclare(c.queue, true, false, false, false, c.args); err != nil {
		return nil, fmt.Errorf("declare queue %q: %w", c.queue, err)
	}
	if err := ch.QueueBind(c.queue, c.bindingKey, c.exchange, false, nil); err != nil {
		return nil, fmt.Errorf("bind queue %q to %q with %q: %w", c.queue, c.exchange, c.bindingKey, err)
	}
	if err := ch.Qos(consumerPrefetch, 0, false); err != nil {
		return nil, fmt.Errorf("set prefetch: %w", err)
	}
	// Not ConsumeWithContext: that cancels the subscription when ctx ends,
	// and ctx here only bounds the connection attempt.
	msgs, err := ch.Consume(c.queue, "", false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consume queue %q: %w", c.queue, err)
	}
	return msgs, nil
}
