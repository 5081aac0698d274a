// Command cdcrelay-inbox-demo shows the consumer's half of the delivery
// contract end to end (`make demo-inbox`): a throwaway PostgreSQL cluster
// holds the outbox (database demo) and the consumer's own database
// (consumer), the relay binary streams the outbox to the local RabbitMQ,
// and a consumer built on package inbox applies each event's effect. The
// consumer is killed once mid-stream, with SIGKILL, right after an effect
// committed and before its ack: the broker redelivers that message to the
// consumer started in its place, and the inbox absorbs the copy. The demo
// prints events committed, effects applied and duplicates absorbed, and
// exits non-zero unless every committed event was applied exactly once.
//
// Everything it creates (cluster, queue, exchange, processes) is removed on
// exit, including on Ctrl-C.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

const (
	demoExchange = "cdcrelay.inbox-demo"
	demoSlot     = "cdcrelay_inbox_demo"
	routingKey   = "orders.created"
	// settleTimeout is how long after the last insert every effect must
	// have been applied.
	settleTimeout = 60 * time.Second
	// readyTimeout bounds waiting for the relay to stream.
	readyTimeout = 30 * time.Second
	// cleanupTimeout bounds each cleanup step, which runs after Ctrl-C too.
	cleanupTimeout = 15 * time.Second
)

type options struct {
	relay    string
	consumer string // the consumer's binary: this program
	events   int
	rate     float64
	dieAfter int
}

func main() {
	if os.Getenv(roleEnv) == "consumer" {
		os.Exit(consume())
	}
	os.Exit(run())
}

func run() int {
	var opts options
	flag.StringVar(&opts.relay, "relay", "bin/cdcrelay", "path to the cdcrelay binary (build it with: make build)")
	flag.IntVar(&opts.events, "events", 200, "number of outbox events to insert")
	flag.Float64Var(&opts.rate, "rate", 50, "events per second to insert (0 = as fast as possible)")
	flag.IntVar(&opts.dieAfter, "kill-after", 0, "kill the consumer in the ack of its n-th applied event (default: a third of -events)")
	flag.Parse()
	if opts.events <= 0 || opts.rate < 0 || opts.dieAfter < 0 || opts.dieAfter > opts.events || flag.NArg() > 0 {
		flag.Usage()
		return 2
	}
	if opts.dieAfter == 0 {
		opts.dieAfter = max(1, opts.events/3)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	opts.consumer = self

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills us if cleanup hangs
	}()
	if _, err := demo(ctx, opts); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "demo: interrupted")
			return 130
		}
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 1
	}
	return 0
}

// summary is what the demo counted at the end.
type summary struct {
	committed  int // rows in the outbox
	applied    int // effect rows in the consumer's database
	distinct   int // distinct message ids among them
	duplicates int // copies the consumers' inboxes acked without applying
	killed     bool
}

func (s summary) check() error {
	if !s.killed {
		return errors.New("the consumer was not killed: the demo showed nothing")
	}
	if s.applied != s.committed || s.distinct != s.committed {
		return fmt.Errorf("effects applied %d (%d distinct) != events committed %d", s.applied, s.distinct, s.committed)
	}
	return nil
}

// step prints a progress line of the demo itself.
func step(format string, args ...any) {
	fmt.Fprintf(os.Stdout, "demo     | "+format+"\n", args...)
}

// cleanup runs a deferred teardown step with its own timeout (the demo's
// context may be cancelled by Ctrl-C) and reports, but does not propagate,
// failures: the remaining steps should still run.
func cleanup(what string, fn func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := fn(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "demo     | cleanup: %s: %v\n", what, err)
		return
	}
	step("cleanup: %s", what)
}
