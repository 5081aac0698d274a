// Command bench (tools/bench, cdcrelay-bench in its messages) is `make
// bench`: in one run it measures the broker's own ceiling (persistent
// messages, publisher confirms, one channel, 1,000 in flight) and, against
// it, the relay binary draining a backlog, its commit-to-consumer latency
// at a steady rate, the load it and a polling drainer put on PostgreSQL,
// and its peak memory. Every throughput is reported as a ratio to a
// reference measured in the same run (mostly the ceiling), because absolute
// figures drift on a shared machine.
//
// With -channels N (default 4; 0 or 1 skips it) it also measures
// partitioned publishing (CDCRELAY_PUBLISH_CHANNELS): the same backlog,
// spread over routing keys bench.part.* that hash to N lanes, each lane's
// keys bound to its own queue, drained once with one channel and once with
// N, the N-channel drain as a ratio to the one-channel one.
//
// Last, unless -standby=false, it measures the relay streaming from a
// physical standby (CDCRELAY_REPLICATION_URL) on a PostgreSQL 16+ primary
// and standby of its own: what the primary and the standby spend per
// event for it, against the polling drainer on the same primary, and the
// latency replay adds. When no 16+ binaries are at hand the report says
// that part did not run (standby.go, standbybin.go).
//
// It starts its own throwaway PostgreSQL cluster (internal/svckit/pgcluster,
// fsync off), uses a RabbitMQ with its own exchange and queues (deleted at the
// end) and runs the relay as a subprocess, as an operator would. The broker
// is the local one unless -amqp-url or $BENCH_AMQP_URL names another; the
// report names its product and version (broker.go). It builds nothing
// itself: pass the binary with -relay (make bench builds it).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

type options struct {
	relay          string
	broker         brokerChoice  // the broker measured against (broker.go)
	backlog        int           // events in the drain backlog and in the one large transaction
	drainerBacklog int           // events the polling drainer drains (it runs at most 400 ev/s)
	bigPayloads    int           // events of 512 KiB in the large-payload backlog
	latencyFor     time.Duration // length of each paced latency phase
	idleFor        time.Duration // idle window for queries/s
	inflight       int           // publisher confirms in flight, relay and ceiling alike
	channels       int           // CDCRELAY_PUBLISH_CHANNELS of the partitioned drain; < 2 skips it
	strict         bool          // exit 3 when a target is missed
	verbose        bool          // latency second by second
	quietWait      time.Duration // longest wait for a quiet machine before each phase
	standby        bool          // run the standby part (standby.go)
	standbyPGBin   string        // its PostgreSQL 16+ binaries; "" picks them (standbybin.go)
	standbyOnly    bool          // run the standby part alone
	standbyLayout  standbyLayout // the outbox's layout in the standby part's relay phases (standbylayout.go)
	phases         []latencyPhase
}

func main() {
	os.Exit(run())
}

func run() int {
	var opts options
	var quick bool
	amqpURL := flag.String("amqp-url", "", "the broker to measure against, amqp://user:password@host:port/vhost (default: $"+benchAMQPURLEnv+", else $CDCRELAY_TEST_AMQP_URL, else the local guest account on 127.0.0.1:5672)")
	flag.StringVar(&opts.relay, "relay", "bin/cdcrelay", "path to the cdcrelay binary (make build)")
	flag.IntVar(&opts.backlog, "backlog", 100_000, "events in the backlog drain and in the one large transaction")
	flag.IntVar(&opts.drainerBacklog, "drainer-backlog", 10_000, "events the polling drainer baseline drains")
	flag.IntVar(&opts.bigPayloads, "big-payloads", 256, "events of 512 KiB in the backlog whose drain's peak RSS is measured")
	flag.DurationVar(&opts.latencyFor, "latency", 20*time.Second, "length of each paced latency phase")
	flag.DurationVar(&opts.idleFor, "idle", 15*time.Second, "idle window for queries per second (the relay's monitor runs every 15s)")
	flag.IntVar(&opts.inflight, "inflight", 1000, "publisher confirms in flight (CDCRELAY_MAX_IN_FLIGHT and the ceiling publisher)")
	flag.IntVar(&opts.channels, "channels", 4, "partitioned drain: N confirm channels (CDCRELAY_PUBLISH_CHANNELS) to N queues, against 1 channel to the same N queues; 0 or 1 skips it")
	flag.BoolVar(&quick, "quick", false, "smoke run: -backlog 10000 -drainer-backlog 2000 -big-payloads 32 -latency 5s -idle 5s -quiet-wait 3s unless given")
	phases := flag.String("phases", defaultPhases, "paced latency phases, RATExEVENTS_PER_TX, comma-separated")
	flag.DurationVar(&opts.quietWait, "quiet-wait", 20*time.Second, "before each phase, wait up to this long for the machine to go quiet (shared machines)")
	flag.BoolVar(&opts.standby, "standby", true, "also measure the relay streaming from a physical standby (PostgreSQL 16+, own clusters)")
	flag.BoolVar(&opts.standbyOnly, "standby-only", false, "run the standby part alone (its sizes from -backlog, -drainer-backlog, -latency, -quick)")
	flag.StringVar(&opts.standbyPGBin, "standby-pg-bin", "", "PostgreSQL 16+ server binaries for the standby part (default: the usual ones if 16+, else 17 from .ci/install-postgres)")
	layout := flag.String("standby-layout", string(layoutDefault), "the outbox's layout in the standby part's relay phases: default (migrations/*.sql) or hot (then also migrations/optional/hot_marks.sql, after the polling drainer's phases, which stay on the default layout)")
	flag.BoolVar(&opts.verbose, "v", false, "print each latency phase second by second")
	flag.BoolVar(&opts.strict, "strict", false, "exit with status 3 when a target is missed")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if quick {
		if !set["backlog"] {
			opts.backlog = 10_000
		}
		if !set["drainer-backlog"] {
			opts.drainerBacklog = 2_000
		}
		if !set["big-payloads"] {
			opts.bigPayloads = 32
		}
		if !set["latency"] {
			opts.latencyFor = 5 * time.Second
		}
		if !set["idle"] {
			opts.idleFor = 5 * time.Second
		}
		if !set["quiet-wait"] {
			opts.quietWait = 3 * time.Second
		}
	}
	if flag.NArg() > 0 || opts.backlog < 1000 || opts.drainerBacklog < 100 || opts.bigPayloads < 1 || opts.latencyFor < time.Second ||
		opts.idleFor < time.Second || opts.inflight < 1 || opts.channels < 0 || opts.channels > maxChannels {
		fmt.Fprintf(os.Stderr, "cdcrelay-bench: want -backlog >= 1000, -drainer-backlog >= 100, -big-payloads >= 1, -latency and -idle >= 1s, -inflight >= 1, -channels 0..%d\n", maxChannels)
		flag.Usage()
		return 2
	}
	var err error
	if opts.broker, err = chooseBroker(*amqpURL, set["amqp-url"], os.Getenv); err != nil {
		fmt.Fprintln(os.Stderr, "cdcrelay-bench: broker:", err)
		return 2
	}
	if opts.standbyLayout, err = standbyLayoutOption(*layout, opts); err != nil {
		fmt.Fprintln(os.Stderr, "cdcrelay-bench: -standby-layout:", err)
		return 2
	}
	if opts.phases, err = parsePhases(*phases); err != nil {
		fmt.Fprintln(os.Stderr, "cdcrelay-bench: -phases:", err)
		return 2
	}
	if _, err := os.Stat(opts.relay); err != nil {
		fmt.Fprintf(os.Stderr, "cdcrelay-bench: relay binary: %v (build it with: make build)\n", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills us if cleanup hangs
	}()

	began := time.Now()
	res, err := runBench(ctx, opts)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "cdcrelay-bench: interrupted")
			return 130
		}
		fmt.Fprintln(os.Stderr, "cdcrelay-bench:", err)
		return 1
	}
	return report(res, opts, began)
}

// report prints the results and returns the exit status: 3 for a missed
// target with -strict. With -standby-only there is only the standby part.
func report(res *results, opts options, began time.Time) int {
	// The broker first: every throughput below is relative to its ceiling,
	// so a report is read against the broker it ran on.
	fmt.Fprintln(stdout)
	fmt.Fprint(stdout, brokerLine(res.machine))
	var rows [][]string
	targets := res.standby.targetRows()
	if !opts.standbyOnly {
		rows = res.rows(opts)
		targets = append(res.targetRows(opts), targets...)
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, formatTable(tableHeader, rows))
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, res.notes(opts))
		fmt.Fprintln(stdout)
		fmt.Fprint(stdout, res.splitNotes())
	}
	fmt.Fprintln(stdout)
	fmt.Fprint(stdout, res.standby.notes())
	fmt.Fprintln(stdout, "\nthe cost targets (per-event CPU and ratios from this run):")
	fmt.Fprintln(stdout)
	fmt.Fprint(stdout, formatTable(targetHeader, targets))
	fmt.Fprintf(stdout, "\nbench took %s\n", time.Since(began).Round(time.Second))
	fmt.Fprint(stdout, res.standby.banner())
	if missed := missedTargets(append(rows, targets...)); len(missed) > 0 {
		fmt.Fprintf(stdout, "targets missed: %v\n", missed)
		if opts.strict {
			return 3
		}
	}
	return 0
}

// stdout is where the bench reports; a program, its output is for a person.
var stdout io.Writer = os.Stdout

// errStopped is returned when the relay process exits during a phase.
var errStopped = errors.New("relay exited")

// say prints a progress line.
func say(format string, args ...any) {
	fmt.Fprintf(stdout, "bench | %s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
