package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/inbox"
	"github.com/cdcrelay/cdcrelay/internal/svckit"
	"github.com/cdcrelay/cdcrelay/internal/svckit/brokernode"
	"github.com/cdcrelay/cdcrelay/internal/svckit/pgcluster"
	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

// demo runs the whole show and returns what it counted. Each resource is
// released by a deferred cleanup with its own timeout.
func demo(ctx context.Context, opts options) (summary, error) {
	var sum summary
	if _, err := os.Stat(opts.relay); err != nil {
		return sum, fmt.Errorf("relay binary: %w (build it with: make build)", err)
	}
	amqpURL := brokernode.AMQPURL()
	if err := brokernode.CheckAMQP(ctx, amqpURL); err != nil {
		return sum, err
	}
	step("starting a throwaway PostgreSQL cluster")
	pg, err := pgcluster.StartPostgres(ctx, pgcluster.PostgresOptions{Log: os.Stderr})
	if err != nil {
		return sum, err
	}
	defer cleanup("remove PostgreSQL cluster", func(context.Context) error { return pg.Close() })
	for _, name := range []string{"demo", "consumer"} {
		if err := pg.CreateDatabase(ctx, name); err != nil {
			return sum, err
		}
	}
	outboxURL, consumerURL := pg.URL("demo"), pg.URL("consumer")
	step("outbox database %s, consumer database %s", outboxURL, consumerURL)

	queue := svckit.UniqueName("cdcrelay_inbox_demo")
	step("declaring exchange %s and queue %s (bound with #)", demoExchange, queue)
	if err := declareQueue(ctx, amqpURL, queue); err != nil {
		return sum, err
	}
	defer cleanup("delete exchange "+demoExchange, func(ctx context.Context) error { return brokernode.DeleteExchange(ctx, amqpURL, demoExchange) })
	defer cleanup("delete queue "+queue, func(ctx context.Context) error { return brokernode.DeleteQueue(ctx, amqpURL, queue) })

	env := relayEnv(outboxURL, amqpURL)
	relayOut := newPrefixWriter(os.Stdout, "relay    | ", "")
	if err := toolkit.Run(ctx, opts.relay, env, "migrate", relayOut); err != nil {
		return sum, err
	}
	relay, err := toolkit.Start(opts.relay, env, "run", relayOut)
	if err != nil {
		return sum, err
	}
	defer cleanup("stop relay", relay.Stop)

	outbox, err := pgx.Connect(ctx, outboxURL)
	if err != nil {
		return sum, fmt.Errorf("connect to the outbox database: %w", err)
	}
	defer cleanup("close outbox connection", outbox.Close)
	consumerDB, err := pgx.Connect(ctx, consumerURL)
	if err != nil {
		return sum, fmt.Errorf("connect to the consumer database: %w", err)
	}
	defer cleanup("close consumer connection", consumerDB.Close)
	step("inbox.Migrate on the consumer database, and its effects table demo_applied (no unique key: an effect applied twice shows)")
	if err := inbox.Migrate(ctx, consumerDB); err != nil {
		return sum, err
	}
	if _, err := consumerDB.Exec(ctx, `CREATE TABLE demo_applied (order_id INT NOT NULL, message_id TEXT NOT NULL,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())`); err != nil {
		return sum, fmt.Errorf("create demo_applied: %w", err)
	}
	if err := waitStreaming(ctx, outbox, relay); err != nil {
		return sum, err
	}
	s := &stream{opts: opts, consumerEnv: consumerEnv(consumerURL, amqpURL, queue), dups: &duplicateCounter{}}
	defer s.stop()
	if err := s.run(ctx, outbox, consumerDB, amqpURL, queue); err != nil {
		return sum, err
	}
	return s.summarise(ctx, outbox, consumerDB)
}

// declareQueue declares the demo's exchange and a durable queue bound to
// it with #, before the relay publishes (it publishes with mandatory).
func declareQueue(ctx context.Context, amqpURL, queue string) error {
	if err := brokernode.DeclareExchange(ctx, amqpURL, demoExchange); err != nil {
		return err
	}
	conn, err := brokernode.DialAMQP(ctx, amqpURL)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %s: %w", queue, err)
	}
	if err := ch.QueueBind(queue, "#", demoExchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s: %w", queue, err)
	}
	return nil
}

// readyMessages is the number of messages waiting in queue.
func readyMessages(ctx context.Context, amqpURL, queue string) (int, error) {
	conn, err := brokernode.DialAMQP(ctx, amqpURL)
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, amqp.Table(nil))
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}

// waitStreaming waits until the relay holds its replication slot.
func waitStreaming(ctx context.Context, db *pgx.Conn, relay *toolkit.Proc) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		var active bool
		err := db.QueryRow(ctx, "SELECT coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $1), false)", demoSlot).Scan(&active)
		if err != nil {
			return fmt.Errorf("wait for the relay to stream: %w", err)
		}
		if active {
			step("relay is streaming from slot %s", demoSlot)
			return nil
		}
		select {
		case <-relay.Exited():
			return fmt.Errorf("relay exited before streaming: %w", relay.Err())
		case <-ctx.Done():
			return fmt.Errorf("relay did not stream within %v: %w", readyTimeout, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
