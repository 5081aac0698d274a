//go:build benchprofile

package main

// TestProfileRelay is not part of `make test` (it needs the benchprofile
// build tag): it runs the relay in this process, under the bench's load,
// and writes one CPU profile per phase, the relay's goroutines labelled
// role=relay so the load generator can be told apart:
//
//	make build
//	go test -tags benchprofile -run TestProfileRelay -v ./tools/bench \
//	    -args -profile-dir /tmp/prof
//	go tool pprof -tagfocus role=relay -top /tmp/prof/drain.prof
//
// The relay binary has no pprof endpoint; this is how its hot path under
// real PostgreSQL and RabbitMQ traffic is profiled.

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sethvargo/go-envconfig"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/relay"
	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

var (
	profileDir     = flag.String("profile-dir", os.TempDir(), "where the per-phase CPU profiles go")
	profileBacklog = flag.Int("profile-backlog", 50_000, "backlog to drain")
	profileFor     = flag.Duration("profile-for", 10*time.Second, "length of each paced phase")
)

func TestProfileRelay(t *testing.T) {
	ctx := context.Background()
	bin, err := filepath.Abs("../../bin/cdcrelay") // only for `migrate`
	if err != nil {
		t.Fatal(err)
	}
	// The same broker `make bench` would use: $BENCH_AMQP_URL, else the tests'.
	broker, err := chooseBroker("", false, os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{opts: options{relay: bin, broker: broker, backlog: *profileBacklog, inflight: 1000, latencyFor: *profileFor}, res: &results{}}
	defer b.teardown()
	if err := b.setup(ctx); err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for k, v := range b.relayVars {
		m[config.Prefix+k] = v
	}
	cfg, err := config.LoadFrom(ctx, envconfig.MapLookuper(m))
	if err != nil {
		t.Fatal(err)
	}
	start := func() (stop func()) {
		svc, err := relay.NewService(cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go pprof.Do(rctx, pprof.Labels("role", "relay"), func(ctx context.Context) { done <- svc.Run(ctx) })
		if err := b.waitSlot(ctx, true, nil); err != nil {
			t.Fatal(err)
		}
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay: %v", err)
			}
			if err := b.waitSlot(ctx, false, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	profile := func(name string, fn func()) {
		f, err := os.Create(filepath.Join(*profileDir, name+".prof"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		fn()
		pprof.StopCPUProfile()
		t.Logf("%s: %s, profile %s", name, time.Since(began).Round(time.Millisecond), f.Name())
	}

	start()() // create the slot
	want, err := b.insertBacklog(ctx, b.opts.backlog, nil)
	if err != nil {
		t.Fatal(err)
	}
	var stop func()
	profile("drain", func() {
		stop = start()
		if _, err := b.cons.waitIDs(ctx, want, nil); err != nil {
			t.Fatal(err)
		}
	})
	defer func() { stop() }()
	b.cons.reset()
	phases, err := parsePhases(defaultPhases)
	if err != nil {
		t.Fatal(err)
	}
	for _, ph := range phases {
		profile(filepathName(ph), func() {
			committed := map[string]time.Time{}
			ticks, took, err := b.insertPaced(ctx, ph, committed)
			if err != nil {
				t.Fatal(err)
			}
			l, err := b.collect(ctx, ph, committed, ticks, took, usage{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d ev/s: p50 %s p99 %s max %s (inserted at %.0f ev/s)", ph.rate, toolkit.Ms(l.p50), toolkit.Ms(l.p99), toolkit.Ms(l.max), l.achieved)
		})
	}
}

func filepathName(ph latencyPhase) string {
	return "steady" + strconv.Itoa(ph.rate)
}
