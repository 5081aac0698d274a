package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

// stream runs the consumers while the events are inserted: the first is
// killed after opts.dieAfter effects, and a second takes its place at once.
type stream struct {
	opts        options
	consumerEnv []string
	dups        *duplicateCounter

	mu      sync.Mutex
	current *toolkit.Proc // the consumer running now
	killed  bool          // the first consumer ended by SIGKILL
}

func (s *stream) startConsumer(n, dieAfter int) (*toolkit.Proc, error) {
	env := append(append([]string(nil), s.consumerEnv...), fmt.Sprintf("%s=%d", dieAfterEnv, dieAfter))
	p, err := toolkit.Start(s.opts.consumer, env, "consume", newPrefixWriter(os.Stdout, fmt.Sprintf("consumer%d| ", n), duplicateMark, s.dups))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.current = p
	s.mu.Unlock()
	return p, nil
}

// stop ends the running consumer with SIGTERM (it prints its summary);
// once.
func (s *stream) stop() {
	s.mu.Lock()
	p := s.current
	s.current = nil
	s.mu.Unlock()
	if p != nil {
		cleanup("stop consumer", p.Stop)
	}
}

// run inserts the events while the consumers apply them, and returns once
// every committed event has an effect and the queue is empty, or fails
// after settleTimeout.
func (s *stream) run(ctx context.Context, outbox, consumerDB *pgx.Conn, amqpURL, queue string) error {
	step("consumer 1 starts, and will be killed in the ack of its effect number %d", s.opts.dieAfter)
	first, err := s.startConsumer(1, s.opts.dieAfter)
	if err != nil {
		return err
	}
	replaced := make(chan error, 1)
	go func() {
		<-first.Exited()
		var exit *exec.ExitError
		killed := errors.As(first.Err(), &exit)
		if killed {
			ws, ok := exit.Sys().(syscall.WaitStatus)
			killed = ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
		}
		s.mu.Lock()
		s.killed = killed
		s.mu.Unlock()
		step("consumer 1 ended (%v); starting consumer 2 in its place", first.Err())
		_, err := s.startConsumer(2, 0)
		replaced <- err
	}()
	step("inserting %d events into the outbox", s.opts.events)
	if err := insertEvents(ctx, outbox, s.opts); err != nil {
		return err
	}
	select {
	case err := <-replaced:
		if err != nil {
			return err
		}
	case <-time.After(settleTimeout):
		return fmt.Errorf("consumer 1 did not end within %v of the last insert", settleTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
	return waitApplied(ctx, outbox, consumerDB, amqpURL, queue)
}

// waitApplied waits until the effects cover every committed event and the
// queue is empty, then a moment more, so that a copy still on its way
// would show as an extra effect.
func waitApplied(ctx context.Context, outbox, consumerDB *pgx.Conn, amqpURL, queue string) error {
	deadline := time.Now().Add(settleTimeout)
	for {
		var committed, applied int
		if err := outbox.QueryRow(ctx, `SELECT count(*) FROM event_outbox`).Scan(&committed); err != nil {
			return fmt.Errorf("count events: %w", err)
		}
		if err := consumerDB.QueryRow(ctx, `SELECT count(DISTINCT message_id) FROM demo_applied`).Scan(&applied); err != nil {
			return fmt.Errorf("count effects: %w", err)
		}
		ready, err := readyMessages(ctx, amqpURL, queue)
		if err != nil {
			return err
		}
		if applied >= committed && ready == 0 {
			step("every event has its effect and the queue is empty; waiting 2 s for stray copies")
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(2 * time.Second):
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %d of %d events applied, %d messages in the queue", settleTimeout, applied, committed, ready)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// summarise stops the consumer, counts and prints the result.
func (s *stream) summarise(ctx context.Context, outbox, consumerDB *pgx.Conn) (summary, error) {
	s.stop()
	s.mu.Lock()
	sum := summary{killed: s.killed, duplicates: s.dups.count()}
	s.mu.Unlock()
	if err := outbox.QueryRow(ctx, `SELECT count(*) FROM event_outbox`).Scan(&sum.committed); err != nil {
		return sum, fmt.Errorf("count events: %w", err)
	}
	if err := consumerDB.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM demo_applied`).Scan(&sum.applied, &sum.distinct); err != nil {
		return sum, fmt.Errorf("count effects: %w", err)
	}
	step("events committed:     %d", sum.committed)
	step("effects applied:      %d (%d distinct events)", sum.applied, sum.distinct)
	step("duplicates absorbed:  %d (acked by the inbox without applying them again)", sum.duplicates)
	if err := sum.check(); err != nil {
		return sum, err
	}
	step("effects applied = events committed: each event applied exactly once, across a consumer killed mid-stream")
	return sum, nil
}

// insertEvents inserts opts.events outbox rows at opts.rate, one per
// transaction and every fourth transaction three at once.
func insertEvents(ctx context.Context, db *pgx.Conn, opts options) error {
	var interval time.Duration
	if opts.rate > 0 {
		interval = time.Duration(float64(time.Second) / opts.rate)
	}
	for tx, order := 1, 1; order <= opts.events; tx++ {
		n := 1
		if tx%4 == 0 {
			n = min(3, opts.events-order+1)
		}
		if _, err := db.Exec(ctx, `INSERT INTO event_outbox (routing_key, payload)
			SELECT $1, jsonb_build_object('event_type', 'order.created', 'order_id', i) FROM generate_series($2::int, $3::int) i`,
			routingKey, order, order+n-1); err != nil {
			return fmt.Errorf("insert events: %w", err)
		}
		order += n
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(n) * interval):
		}
	}
	return nil
}

// relayEnv is the relay's configuration for the demo; other CDCRELAY_*
// variables of the caller pass through.
func relayEnv(dbURL, amqpURL string) []string {
	return toolkit.Env(map[string]string{
		"DATABASE_URL": dbURL,
		"AMQP_URL":     amqpURL,
		"EXCHANGE":     demoExchange,
		"HTTP_ADDR":    "127.0.0.1:0",
		"SLOT":         demoSlot,
	})
}

// consumerEnv is a consumer process's environment.
func consumerEnv(dbURL, amqpURL, queue string) []string {
	return append(os.Environ(), roleEnv+"=consumer", dbEnv+"="+dbURL, amqpEnv+"="+amqpURL, queueEnv+"="+queue)
}

// duplicateCounter counts the consumers' duplicate lines.
type duplicateCounter struct {
	mu sync.Mutex
	n  int
}

func (c *duplicateCounter) add() { c.mu.Lock(); c.n++; c.mu.Unlock() }

func (c *duplicateCounter) count() int { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// prefixWriter writes each complete line with a prefix, as one Write, so
// the processes' lines interleave cleanly; a line containing mark counts
// on marks.
type prefixWriter struct {
	mu     sync.Mutex
	out    io.Writer
	prefix []byte
	mark   []byte
	marks  *duplicateCounter
	buf    []byte
}

func newPrefixWriter(out io.Writer, prefix, mark string, marks ...*duplicateCounter) *prefixWriter {
	w := &prefixWriter{out: out, prefix: []byte(prefix), mark: []byte(mark)}
	if len(marks) > 0 {
		w.marks = marks[0]
	}
	return w
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.emit(w.buf[:i+1])
		w.buf = w.buf[i+1:]
	}
}

// Flush writes a trailing partial line; toolkit.Proc calls it once the
// process has exited.
func (w *prefixWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.emit(append(w.buf, '\n'))
		w.buf = nil
	}
}

func (w *prefixWriter) emit(line []byte) {
	if w.marks != nil && len(w.mark) > 0 && bytes.Contains(line, w.mark) {
		w.marks.add()
	}
	_, _ = w.out.Write(append(append([]byte(nil), w.prefix...), line...))
}
