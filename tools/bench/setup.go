package main

// Setup and teardown: the throwaway cluster, roles, the bench exchange and
// queues, the slot, and the quiet machine each phase starts from.

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/svckit"
	"github.com/cdcrelay/cdcrelay/internal/svckit/brokernode"
	"github.com/cdcrelay/cdcrelay/internal/svckit/pgcluster"
	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

func (b *bench) setup(ctx context.Context) error {
	r := b.res
	r.machine = readMachine(b.opts.relay)
	b.amqpURL = b.opts.broker.url
	// Before the cluster starts: a wrong broker fails in seconds, and its
	// name heads the progress lines of a run that takes minutes.
	name, err := probeBroker(ctx, b.amqpURL)
	if err != nil {
		return err
	}
	r.machine.broker, r.machine.brokerAt, r.machine.brokerBy = name, redactedURL(b.amqpURL), b.opts.broker.from
	say("%s", strings.TrimSpace(brokerLine(r.machine)))
	b.brokerPID = findBroker(b.amqpURL)
	say("starting a throwaway PostgreSQL cluster (fsync off, pg_stat_statements)")
	pg, err := pgcluster.StartPostgres(ctx, pgcluster.PostgresOptions{
		Settings: map[string]string{"shared_preload_libraries": "pg_stat_statements"},
		Log:      os.Stderr,
	})
	if err != nil {
		return err
	}
	b.pg = pg
	b.defer_("remove PostgreSQL cluster", func(context.Context) error { return pg.Close() })
	if b.postmaster, err = postmasterPID(pg.DataDir()); err != nil {
		return err
	}
	if err := pg.CreateDatabase(ctx, benchDatabase); err != nil {
		return err
	}
	b.superURL = pg.URL(benchDatabase)
	if err := runOnce(ctx, b.opts.relay, toolkit.Env(map[string]string{"DATABASE_URL": b.superURL, "LOG_LEVEL": "warn"}), "migrate"); err != nil {
		return err
	}
	if b.db, err = pgx.Connect(ctx, b.superURL); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	b.defer_("close database connection", b.db.Close)
	_, err = b.db.Exec(ctx, "CREATE EXTENSION pg_stat_statements;"+rolesSQL)
	if err != nil {
		return fmt.Errorf("roles: %w", err)
	}
	if err := b.db.QueryRow(ctx, "SHOW server_version").Scan(&r.machine.postgres); err != nil {
		return err
	}
	b.relayURL, b.drainerURL = withUser(b.superURL, relayRole), withUser(b.superURL, drainerRole)
	if b.ins, err = newInserter(ctx, b.superURL); err != nil {
		return err
	}
	b.defer_("close inserter", func(context.Context) error { return b.ins.close() })
	if b.body, b.trace, err = samplePayload(ctx, b.db, 50_000); err != nil {
		return err
	}
	r.payloadBytes = len(b.body)

	b.exchange = svckit.UniqueName("cdcrelay_bench")
	b.queue = svckit.UniqueName("cdcrelay_bench_q")
	if b.opts.channels > 1 {
		if b.partLanes, err = laneKeys(b.opts.channels, keysPerLane); err != nil {
			return err
		}
		b.partKeys = interleave(b.partLanes)
		for i := range b.partLanes {
			b.partQueues = append(b.partQueues, fmt.Sprintf("%s_part%d", b.queue, i))
		}
	}
	if err := b.declare(ctx); err != nil {
		return err
	}
	if b.cons, err = startConsumer(ctx, b.amqpURL, append([]string{b.queue}, b.partQueues...)...); err != nil {
		return err
	}
	b.defer_("stop consumer", func(context.Context) error { return b.cons.close() })
	b.relayVars = map[string]string{
		"DATABASE_URL": b.relayURL, "AMQP_URL": b.amqpURL, "EXCHANGE": b.exchange, "SLOT": benchSlot,
		"HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": "warn", "MAX_IN_FLIGHT": strconv.Itoa(b.opts.inflight),
	}
	r.passThrough = passedThrough(b.relayVars)
	say("PostgreSQL %s, %s, exchange %s, queue %s, payload %d bytes", r.machine.postgres, r.machine.broker, b.exchange, b.queue, r.payloadBytes)
	return nil
}

// rolesSQL creates the relay's least-privilege role and the drainer's.
const rolesSQL = `
	CREATE ROLE ` + relayRole + ` LOGIN REPLICATION;
	GRANT SELECT, DELETE ON event_outbox TO ` + relayRole + `;
	GRANT UPDATE (published_at, attempts, last_error) ON event_outbox TO ` + relayRole + `;
	CREATE ROLE ` + drainerRole + ` LOGIN;
	GRANT SELECT ON event_outbox TO ` + drainerRole + `;
	GRANT UPDATE (published_at) ON event_outbox TO ` + drainerRole

// declare creates the bench exchange, its durable queue bound with
// mainBinding and, for the partitioned drain, one durable queue per lane
// bound to exactly that lane's keys; it registers their deletion. The
// main binding does not match the partitioned keys, so the main queue
// never holds the partitioned drain's messages.
func (b *bench) declare(ctx context.Context) error {
	if err := brokernode.DeclareExchange(ctx, b.amqpURL, b.exchange); err != nil {
		return err
	}
	b.defer_("delete exchange "+b.exchange, func(ctx context.Context) error {
		return brokernode.DeleteExchange(ctx, b.amqpURL, b.exchange)
	})
	conn, err := brokernode.DialAMQP(ctx, b.amqpURL)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	bind := func(queue string, keys ...string) error {
		// Durable, not exclusive, no x-queue-mode or other optional
		// arguments: RabbitMQ 4.3 refuses a transient non-exclusive queue
		// (541, closing the connection) and deprecates the rest, so only
		// this shape runs on every broker the bench is pointed at.
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare queue: %w", err)
		}
		b.defer_("delete queue "+queue, func(ctx context.Context) error {
			return brokernode.DeleteQueue(ctx, b.amqpURL, queue)
		})
		for _, key := range keys {
			if err := ch.QueueBind(queue, key, b.exchange, false, nil); err != nil {
				return fmt.Errorf("bind queue %s to %s: %w", queue, key, err)
			}
		}
		return nil
	}
	if err := bind(b.queue, mainBinding); err != nil {
		return err
	}
	for i, q := range b.partQueues {
		if err := bind(q, b.partLanes[i]...); err != nil {
			return err
		}
	}
	return nil
}

// defer_ registers a teardown step; they run in reverse order.
func (b *bench) defer_(what string, fn func(context.Context) error) {
	b.cleanups = append(b.cleanups, func(ctx context.Context) error {
		if err := fn(ctx); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	})
}

func (b *bench) teardown() {
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		if err := b.cleanups[i](ctx); err != nil {
			fmt.Fprintln(os.Stderr, "cdcrelay-bench: cleanup:", err)
		}
		cancel()
	}
}

// createSlot runs the relay once so it creates the publication's slot, then
// stops it: the backlog that follows is in the slot's stream.
func (b *bench) createSlot(ctx context.Context) error {
	say("relay creates slot %s, then stops", benchSlot)
	rp, err := b.startRelay(ctx, b.relayVars)
	if err != nil {
		return err
	}
	return b.stopRelay(ctx, rp)
}

// quiesce takes the periodic background work that would otherwise land in
// a measured window at random out of it: a checkpoint, and the vacuum and
// analyze the inserts would trigger.
func (b *bench) quiesce(ctx context.Context) error {
	if _, err := b.db.Exec(ctx, "VACUUM ANALYZE event_outbox"); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	if _, err := b.db.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if b.standby != nil {
		// A restartpoint: the standby's own buffer writes out of the window too.
		if _, err := b.standby.db.Exec(ctx, "CHECKPOINT"); err != nil {
			return fmt.Errorf("checkpoint on the standby: %w", err)
		}
	}
	return nil
}

// quietBusy is the machine load (busy cores, every process) below which
// a phase starts at once; above it, prepare waits up to opts.quietWait for
// other work on a shared machine to pass.
const quietBusy = 0.3

// prepare readies a measured phase: the background work of our own cluster
// out of the way (quiesce), then the machine as quiet as it gets within
// opts.quietWait. The load it found is reported with the phase.
func (b *bench) prepare(ctx context.Context) error {
	if err := b.quiesce(ctx); err != nil {
		return err
	}
	deadline := time.Now().Add(b.opts.quietWait)
	for {
		m0, err := readMachineCPU()
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
		m1, err := readMachineCPU()
		if err != nil {
			return err
		}
		b.background = busyCores(m0, m1, runtime.NumCPU())
		if b.background < quietBusy || time.Now().After(deadline) {
			return nil
		}
	}
}

// runOnce runs a relay subcommand to completion; its output is shown only
// if it fails.
func runOnce(ctx context.Context, bin string, env []string, subcommand string) error {
	var out svckit.Buffer
	if err := toolkit.Run(ctx, bin, env, subcommand, &out); err != nil {
		return fmt.Errorf("%w\n%s", err, out.String())
	}
	return nil
}

func withUser(raw, user string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	u.User = url.User(user)
	return u.String()
}
