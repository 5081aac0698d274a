// Command cdcrelay-demo shows cdcrelay end to end on a laptop (`make demo`):
// it starts a throwaway PostgreSQL cluster, runs the relay binary against it
// and a local RabbitMQ, inserts sample outbox events at a steady rate and
// prints every message as it reaches a consumer, with its latency.
//
// Everything it creates (cluster, queue, exchange, relay process) is removed
// on exit, including on Ctrl-C.
//
// With -serve (`make tour-db`) it only starts the throwaway cluster, with
// wal_level=logical and a database for the README's tour, prints its URL and
// keeps it until Ctrl-C.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/svckit"
	"github.com/cdcrelay/cdcrelay/internal/svckit/brokernode"
	"github.com/cdcrelay/cdcrelay/internal/svckit/pgcluster"
	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

const (
	demoDatabase = "demo"
	demoExchange = "cdcrelay.demo"
	demoSlot     = "cdcrelay_demo"
	routingKey   = "orders.created"
	// deliveryTimeout is how long after the last insert every event must have
	// reached the consumer for the demo to succeed.
	deliveryTimeout = 30 * time.Second
	// readyTimeout bounds waiting for the relay to start streaming.
	readyTimeout = 30 * time.Second
	// cleanupTimeout bounds each cleanup step, which runs after Ctrl-C too.
	cleanupTimeout = 15 * time.Second
)

type options struct {
	relay  string
	events int
	rate   float64
	serve  bool
}

func main() {
	os.Exit(run())
}

func run() int {
	var opts options
	flag.StringVar(&opts.relay, "relay", "bin/cdcrelay", "path to the cdcrelay binary (build it with: go build -o bin/cdcrelay ./cmd/cdcrelay)")
	flag.IntVar(&opts.events, "events", 50, "number of outbox events to insert")
	flag.Float64Var(&opts.rate, "rate", 10, "events per second to insert (0 = as fast as possible)")
	flag.BoolVar(&opts.serve, "serve", false, "only start a throwaway PostgreSQL with wal_level=logical and a database "+tourDatabase+
		" for the README's tour, print its URL and keep it until Ctrl-C, then remove it (make tour-db)")
	flag.Parse()
	if opts.events <= 0 || opts.rate < 0 || flag.NArg() > 0 {
		flag.Usage()
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		// Restore default signal handling so a second Ctrl-C kills us if
		// cleanup hangs.
		stop()
	}()

	do := demo
	if opts.serve {
		do = func(ctx context.Context, _ options) error { return serveDatabase(ctx) }
	}
	if err := do(ctx, opts); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "demo: interrupted")
			return 130
		}
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	return 0
}

// demo runs the whole show. Each resource is released by a deferred cleanup
// that runs with its own timeout, because ctx may already be cancelled.
func demo(ctx context.Context, opts options) (err error) {
	if _, err := os.Stat(opts.relay); err != nil {
		return fmt.Errorf("relay binary: %w (build it with: go build -o %s ./cmd/cdcrelay)", err, opts.relay)
	}
	amqpURL := brokernode.AMQPURL()
	step("checking RabbitMQ at %s", redact(amqpURL))
	if err := brokernode.CheckAMQP(ctx, amqpURL); err != nil {
		return err
	}

	step("starting a throwaway PostgreSQL cluster")
	pg, err := pgcluster.StartPostgres(ctx, pgcluster.PostgresOptions{Log: os.Stderr})
	if err != nil {
		return err
	}
	defer cleanup("remove PostgreSQL cluster", func(context.Context) error { return pg.Close() })
	if err := pg.CreateDatabase(ctx, demoDatabase); err != nil {
		return err
	}
	dbURL := pg.URL(demoDatabase)
	step("PostgreSQL %s ready (data in %s)", dbURL, pg.DataDir())

	// The queue must exist before the relay publishes: the relay publishes
	// with mandatory, so an unroutable message is an error, not a drop.
	queue := svckit.UniqueName("cdcrelay_demo")
	step("declaring exchange %s and queue %s (bound with #)", demoExchange, queue)
	consumer, err := brokernode.NewConsumer(ctx, amqpURL, demoExchange, queue, "#")
	if err != nil {
		return err
	}
	defer cleanup("delete exchange "+demoExchange, func(ctx context.Context) error {
		return brokernode.DeleteExchange(ctx, amqpURL, demoExchange)
	})
	defer cleanup("delete queue "+queue, func(context.Context) error { return consumer.Close() })

	env := relayEnv(dbURL, amqpURL)
	step("%s migrate", opts.relay)
	if err := runRelayOnce(ctx, opts.relay, env, "migrate"); err != nil {
		return err
	}
	step("%s run", opts.relay)
	relay, err := startRelay(opts.relay, env, "run")
	if err != nil {
		return err
	}
	defer cleanup("stop relay", relay.Stop)

	db, err := connectDB(ctx, dbURL)
	if err != nil {
		return err
	}
	defer cleanup("close database connection", db.Close)

	if err := waitStreaming(ctx, db, relay, demoSlot); err != nil {
		return err
	}
	return deliver(ctx, opts, db, consumer, relay)
}

// deliver inserts the events while printing deliveries as they arrive, then
// prints the summary. It fails if not every event arrived in time.
func deliver(ctx context.Context, opts options, db *pgx.Conn, consumer *brokernode.Consumer, relay *toolkit.Proc) error {
	step("inserting %d events at %s", opts.events, rateText(opts.rate))
	watchCtx, cancelWatch := context.WithCancelCause(ctx)
	defer cancelWatch(nil)
	watched := make(chan *stats, 1)
	go func() { watched <- watch(watchCtx, consumer, opts.events) }()
	// A relay that dies makes waiting pointless; say so instead of timing out.
	go func() {
		select {
		case <-relay.Exited():
			cancelWatch(fmt.Errorf("relay exited: %w", relay.Err()))
		case <-watchCtx.Done():
		}
	}()

	if err := insertEvents(watchCtx, db, opts); err != nil {
		cancelWatch(err)
		(<-watched).print(opts.events)
		return fmt.Errorf("insert events: %w", context.Cause(watchCtx))
	}
	timer := time.AfterFunc(deliveryTimeout, func() {
		cancelWatch(fmt.Errorf("not all events arrived within %v of the last insert", deliveryTimeout))
	})
	defer timer.Stop()
	st := <-watched

	st.print(opts.events)
	printJanitorProgress(ctx, db)
	if st.delivered < opts.events {
		cause := context.Cause(watchCtx)
		if cause == nil {
			cause = errors.New("consumer stopped early")
		}
		return fmt.Errorf("%d of %d events delivered: %w", st.delivered, opts.events, cause)
	}
	return nil
}

// step prints a progress line of the demo itself.
func step(format string, args ...any) {
	fmt.Printf("demo  | "+format+"\n", args...)
}

// cleanup runs a deferred teardown step with its own timeout (the demo's
// context may be cancelled by Ctrl-C) and reports, but does not propagate,
// failures: the remaining steps should still run.
func cleanup(what string, fn func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := fn(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "demo  | cleanup: %s: %v\n", what, err)
		return
	}
	step("cleanup: %s", what)
}

// redact hides the password of a URL for printing.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparseable URL>"
	}
	return u.Redacted()
}

func rateText(rate float64) string {
	if rate == 0 {
		return "full speed"
	}
	return fmt.Sprintf("%g events/s", rate)
}
