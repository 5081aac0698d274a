// Command cdcrelay streams transactional-outbox inserts from a PostgreSQL
// logical replication slot to RabbitMQ with publisher confirms.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/failpoint"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/relay"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/migrations"
)

const usage = `usage: cdcrelay <command> [flags]

commands:
  run      stream outbox inserts to RabbitMQ (configuration: CDCRELAY_* variables, see docs/configuration.md)
  migrate  create the outbox table, its index and the publication (idempotent); -hot-marks: the HOT layout
  check    preflight the database, role, publication, slot and broker; exits 1 on any error
  tail     print what is published to CDCRELAY_EXCHANGE
  version  print the version
  help     print this text

cdcrelay help <command>, or cdcrelay <command> -h: that command's flags and what it does.
`

// commandUsage is the usage of each command without flags of its own;
// migrate and tail print theirs from their flag sets.
var commandUsage = map[string]string{
	"run": `usage: cdcrelay run

Streams the outbox table's inserts from the logical replication slot to
RabbitMQ with publisher confirms, and marks each row published once the
broker has acknowledged it. Creates the publication (if the role may) and the
slot when missing. A second relay on the same slot waits as a hot standby.
SIGINT or SIGTERM drains what is in flight and exits 0.

Takes no flags: every setting is a CDCRELAY_* variable (docs/configuration.md);
CDCRELAY_DATABASE_URL and CDCRELAY_AMQP_URL are required. Serves /metrics,
/healthz and /readyz on CDCRELAY_HTTP_ADDR (default :8080).
`,
	"check": `usage: cdcrelay check

Preflight: connects as run would, with the same CDCRELAY_* variables, and
prints one line per finding (OK, WARN or ERROR, each problem with its remedy):
unknown variables, wal_level, the role's privileges, the outbox table, the
publication, the slot, the slot lock, the broker and the exchange; with
CDCRELAY_AMQP_MANAGEMENT_URL also the queues bound to the exchange.
Exits 1 on any ERROR, 0 otherwise. Takes no flags.
`,
	"version": `usage: cdcrelay version

Prints the version the binary was built with. Takes no flags.
`,
}

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// isHelp reports whether arg asks for usage, as the flag package reads it.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "--h":
		return true
	}
	return false
}

func run(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0:
		fmt.Fprint(stderr, usage)
		return 2
	case isHelp(args[0]) || (args[0] == "help" && len(args) == 1):
		fmt.Fprint(stdout, usage)
		return 0
	case args[0] == "help":
		return commandHelp(args[1], stdout, stderr)
	case len(args) > 1 && isHelp(args[1]):
		return commandHelp(args[0], stdout, stderr)
	case len(args) > 1 && args[0] != "tail" && args[0] != "migrate":
		if _, known := commandUsage[args[0]]; known {
			fmt.Fprintf(stderr, "cdcrelay %s takes no arguments (got %q)\n\n%s", args[0], args[1:], commandUsage[args[0]])
		} else {
			fmt.Fprintf(stderr, "unknown command %q\n%s", args[0], usage)
		}
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch args[0] {
	case "run":
		err = runRelay(ctx, stderr)
	case "migrate":
		err = migrate(ctx, args[1:], stderr)
	case "check":
		err = check(ctx, stdout, stderr)
	case "tail":
		err = tail(ctx, args[1:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, version)
	default:
		fmt.Fprintf(stderr, "unknown command %q\n%s", args[0], usage)
		return 2
	}
	if err != nil {
		if !errors.As(err, new(loggedError)) {
			fmt.Fprintln(stderr, "cdcrelay:", err)
		}
		return 1
	}
	return 0
}

// commandHelp prints the usage of command on stdout: its flags and what it
// does. migrate and tail print their flag sets' usage (to the writer they
// are given for errors, here stdout) and return at -h without doing anything.
func commandHelp(command string, stdout, stderr io.Writer) int {
	var err error
	switch command {
	case "migrate":
		err = migrate(context.Background(), []string{"-h"}, stdout)
	case "tail":
		err = tail(context.Background(), []string{"-h"}, stdout, stdout)
	default:
		text, ok := commandUsage[command]
		if !ok {
			fmt.Fprintf(stderr, "unknown command %q\n%s", command, usage)
			return 2
		}
		fmt.Fprint(stdout, text)
	}
	if err != nil {
		fmt.Fprintln(stderr, "cdcrelay:", err)
		return 1
	}
	return 0
}

func loadConfig(ctx context.Context, stderr io.Writer) (config.Config, *slog.Logger, error) {
	cfg, err := config.Load(ctx)
	if err != nil {
		return cfg, nil, fmt.Errorf("configuration:\n%w", err)
	}
	return cfg, newLogger(cfg, stderr).With("slot", cfg.Slot), nil
}

func runRelay(ctx context.Context, stderr io.Writer) error {
	cfg, log, err := loadConfig(ctx, stderr)
	if err != nil {
		return err
	}
	if err := cfg.RequireBroker(); err != nil {
		return fmt.Errorf("configuration:\n%w", err)
	}
	if err := serve(ctx, cfg, log); err != nil {
		// At ERROR and cause first, where the runbook's first filter
		// (level=ERROR or WARN) finds it; not printed a second time.
		log.Error("fatal: " + cfg.Scrub(err.Error()))
		return loggedError{err}
	}
	log.Info("exiting")
	return nil
}

// loggedError is a fatal error the relay's logger already reported.
type loggedError struct{ error }

func (e loggedError) Unwrap() error { return e.error }

// serve runs the relay and its HTTP server until ctx ends or one fails.
func serve(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	warnUnknown(log, os.Environ())
	setMemoryLimit(log, os.Getenv, systemCgroup)
	setMaxProcs(log, os.Getenv)
	reg := prometheus.NewRegistry()
	svc, err := newService(cfg, log, reg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on CDCRELAY_HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
	}
	log.Info("starting", "version", version, "database_url", config.Redact(cfg.DatabaseURL),
		"amqp_url", config.Redact(cfg.AMQPURL), "exchange", cfg.Exchange, "http", ln.Addr().String())
	srv := &http.Server{Handler: httpHandler(reg, svc.Relay), ReadHeaderTimeout: 5 * time.Second}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		return svc.Run(gctx)
	})
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
		return nil
	})
	return g.Wait()
}

// buildInfo is cdcrelay_build_info{version,goversion} = 1: the usual way
// to tell in Prometheus which version each pod runs.
func buildInfo() prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "cdcrelay_build_info",
		Help: "Always 1; the labels give the relay's version and the Go version it was built with.",
	}, []string{"version", "goversion"})
	g.WithLabelValues(version, runtime.Version()).Set(1)
	return g
}

// unknownVariables are the CDCRELAY_* variables of environ the relay does
// not read (failpoint builds read CDCRELAY_FAILPOINT too).
func unknownVariables(environ []string) []config.UnknownVariable {
	var extra []string
	if failpoint.Enabled {
		extra = append(extra, failpoint.Env)
	}
	return config.Unknown(environ, extra...)
}

// warnUnknown logs one warning listing the CDCRELAY_* variables the relay
// does not read: a misspelt one leaves its setting at the default.
func warnUnknown(log *slog.Logger, environ []string) {
	unknown := unknownVariables(environ)
	if len(unknown) == 0 {
		return
	}
	names := make([]string, len(unknown))
	for i, u := range unknown {
		names[i] = u.String()
	}
	log.Warn("ignoring unknown CDCRELAY_* environment variables (a misspelt name leaves its setting at the default)",
		"variables", strings.Join(names, ", "))
}

// newService builds the relay's stages with every metric `run` serves
// registered with reg. docs/metrics.txt lists what it registers
// (TestMetricsList), so register any new metric here or below it.
func newService(cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (*relay.Service, error) {
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo())
	return relay.NewService(cfg, log, reg)
}

func httpHandler(reg *prometheus.Registry, r *relay.Relay) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	// Healthy means alive and not wedged; a failing pipeline that keeps
	// retrying is healthy (restarting the pod would not help it).
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := r.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	// Ready means doing its job: streaming, or a healthy hot standby
	// waiting for the slot. Starting or backing off after a failure is not;
	// the body then says what it waits for when the relay knows.
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		role := r.Role()
		if role != relay.RoleStreaming && role != relay.RoleStandby {
			http.Error(w, r.Status(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, r.Status()+"\n") // the role, and what it waits for (a blocked broker)
	})
	return mux
}

func migrate(ctx context.Context, args []string, stderr io.Writer) error {
	flags := flag.NewFlagSet("migrate", flag.ContinueOnError)
	flags.SetOutput(stderr)
	hot := flags.Bool("hot-marks", false, "also put the table on the HOT layout (migrations/optional/hot_marks.sql: no index names published_at, fillfactor 50)")
	flags.Usage = func() {
		fmt.Fprint(stderr, "usage: cdcrelay migrate [-hot-marks]\n\n"+
			"Creates the outbox table (CDCRELAY_TABLE), its indexes and the publication\n"+
			"(CDCRELAY_PUBLICATION) in CDCRELAY_DATABASE_URL: migrations/*.sql, applied to the\n"+
			"configured names. Idempotent. Run it as the table's owner: the relay's\n"+
			"least-privilege role cannot create the publication (docs/least-privilege.md).\n\n")
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if flags.NArg() > 0 {
		return fmt.Errorf("migrate takes no arguments, only -hot-marks (got %q)", flags.Args())
	}
	cfg, _, err := loadConfig(ctx, stderr)
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr) // no slot: migrate has none
	db, err := pgconnect.Connect(ctx, cfg.DatabaseURL, "to database", pgconnect.Options{})
	if err != nil {
		return err
	}
	defer pgconnect.Close(ctx, db)
	// The files name public.event_outbox and cdcrelay_outbox; migrate
	// applies them to the configured table and publication instead, so it
	// never leaves a stray table or a publication of another table. It runs
	// as the table's owner (the relay's least-privilege role cannot create
	// the publication).
	outbox, err := cfg.Outbox()
	if err != nil {
		return err
	}
	apply := migrations.ApplyTo
	if *hot {
		apply = migrations.ApplyHOT
	}
	if err := apply(ctx, db, outbox); err != nil {
		return err
	}
	// A publication of that name that already existed is left as it is:
	// fail now if run would refuse it, rather than let run refuse it later.
	_, foreign, err := slot.VerifyPublication(ctx, db, outbox)
	if err != nil {
		return err
	}
	for _, rel := range foreign {
		log.Warn("the publication also publishes a table that is not the outbox: the relay skips its inserts", "publication", cfg.Publication, "table", rel.Qualified())
	}
	files := migrations.Names()
	if *hot {
		files = append(files, migrations.HOTFile)
	}
	log.Info("migrations applied", "files", files, "table", cfg.Table, "publication", cfg.Publication)
	return nil
}
