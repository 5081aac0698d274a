package janitor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// TestShuttingDownClassification: only the errors that say the server is
// shutting down or not running count; permission errors, idle timeouts and
// transport failures on the janitor's path do not.
func TestShuttingDownClassification(t *testing.T) {
	pg := func(code string) error {
		return fmt.Errorf("connect: %w", &pgconn.PgError{Severity: "FATAL", Code: code})
	}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, c := range []struct {
		name             string
		err              error
		down, terminated bool
	}{
		{"admin_shutdown", pg("57P01"), false, true},
		{"crash_shutdown", pg("57P02"), true, false},
		{"cannot_connect_now", pg("57P03"), true, false},
		{"idle_session_timeout", pg("57P05"), false, false},
		{"insufficient_privilege", pg("42501"), false, false},
		{"too_many_connections", pg("53300"), false, false},
		{"refused", fmt.Errorf("connect: %w", refused), false, false},
		{"eof", fmt.Errorf("mark: %w", io.ErrUnexpectedEOF), false, false},
		{"nil", nil, false, false},
	} {
		if got := shuttingDown(c.err); got != c.down {
			t.Errorf("%s: ShuttingDown = %v, want %v", c.name, got, c.down)
		}
		if got := terminated(c.err); got != c.terminated {
			t.Errorf("%s: Terminated = %v, want %v", c.name, got, c.terminated)
		}
	}
}

// stoppingFakeServer answers the n-th connection (from 0) with script(n, backend).
func stoppingFakeServer(t *testing.T, script func(n int, b *pgproto3.Backend)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				b := pgproto3.NewBackend(c, c)
				if _, err := b.ReceiveStartupMessage(); err != nil {
					return
				}
				script(n, b)
			}()
		}
	}()
	return "postgres://x@" + ln.Addr().String() + "/db?sslmode=disable&connect_timeout=2"
}

// stoppingFatal sends a FATAL error with code, as the server does before it
// closes a connection.
func stoppingFatal(b *pgproto3.Backend, code string) {
	b.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: code, Message: "fake " + code})
	_ = b.Flush()
}

// stoppingSession accepts the session, then ends it with a FATAL code at
// the first statement (a backend terminated while the janitor was idle),
// or with no word if code is empty.
func stoppingSession(b *pgproto3.Backend, code string) {
	b.Send(&pgproto3.AuthenticationOk{})
	b.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 2}})
	b.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if b.Flush() != nil {
		return
	}
	if _, err := b.Receive(); err != nil || code == "" {
		return // "": the connection just closes
	}
	stoppingFatal(b, code)
}

// TestStoppingSignalsShutdown runs a janitor with one queued mark against
// fake servers and watches DatabaseShuttingDown: a shutdown closes its
// channel (and a fresh channel is armed for later watchers), other
// failures never do, and the mark is never dropped.
func TestStoppingSignalsShutdown(t *testing.T) {
	for _, c := range []struct {
		name   string
		script func(n int, b *pgproto3.Backend)
		want   bool
	}{
		{"57P03 at connect", func(_ int, b *pgproto3.Backend) { stoppingFatal(b, "57P03") }, true},
		{"57P02 at connect", func(_ int, b *pgproto3.Backend) { stoppingFatal(b, "57P02") }, true},
		{"57P01, then 57P03 at once", func(n int, b *pgproto3.Backend) {
			if n == 0 {
				stoppingSession(b, "57P01")
				return
			}
			stoppingFatal(b, "57P03")
		}, true},
		{"57P01 twice in a row", func(_ int, b *pgproto3.Backend) { stoppingSession(b, "57P01") }, true},
		{"EOF on an open connection, then 57P03 at once", func(n int, b *pgproto3.Backend) {
			if n == 0 {
				stoppingSession(b, "")
				return
			}
			stoppingFatal(b, "57P03")
		}, true},
		{"57P01, then EOF (not a shutdown)", func(n int, b *pgproto3.Backend) {
			if n == 0 {
				stoppingSession(b, "57P01")
			}
		}, false},
		{"42501 at connect", func(_ int, b *pgproto3.Backend) { stoppingFatal(b, "42501") }, false},
		{"42501 at the statement", func(_ int, b *pgproto3.Backend) { stoppingSession(b, "42501") }, false},
		{"EOF at connect", func(int, *pgproto3.Backend) {}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := stoppingFakeServer(t, c.script)
			stoppingRun(t, url, c.want)
		})
	}
}

func stoppingRun(t *testing.T, url string, want bool) {
	// A shutdown must be seen before any backoff: a lost connection is
	// tried again at once. Other failures must be retried a few times.
	backoff, wait := 100*time.Millisecond, time.Second
	if want {
		backoff, wait = 10*time.Second, 5*time.Second
	}
	j := New(Options{
		DatabaseURL: url, Outbox: config.Outbox{Schema: "public", Table: "event_outbox", IDColumn: "id"}, MarkBatch: 10,
		MarkInterval: 10 * time.Millisecond, BackoffMin: 10 * time.Millisecond, BackoffMax: backoff,
	}, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	dbShuttingDown := j.DatabaseShuttingDown()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = j.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var marked atomic.Bool
	mustMark(t, j, "a", func() { marked.Store(true) })
	select {
	case <-dbShuttingDown:
		if !want {
			t.Fatal("DatabaseShuttingDown closed for a failure that is not a shutdown")
		}
		if again := j.DatabaseShuttingDown(); again == dbShuttingDown {
			t.Fatal("no fresh channel armed after the signal")
		}
	case <-time.After(wait):
		if want {
			t.Fatalf("DatabaseShuttingDown not closed after %s", wait)
		}
		if n := value(j.metrics.errors); n < 3 {
			t.Fatalf("only %v failed attempts in %s; the case was not exercised", n, wait)
		}
	}
	if j.Pending() != 1 || marked.Load() {
		t.Fatalf("the unwritten mark was dropped or called done: pending %d", j.Pending())
	}
}
