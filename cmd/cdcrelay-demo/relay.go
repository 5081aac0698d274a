package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"sync"

	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

// relayEnv is the relay's configuration for the demo. The demo's settings
// win over the user's environment; other CDCRELAY_* variables (e.g.
// CDCRELAY_LOG_LEVEL) pass through.
func relayEnv(dbURL, amqpURL string) []string {
	return toolkit.Env(map[string]string{
		"DATABASE_URL": dbURL,
		"AMQP_URL":     amqpURL,
		"EXCHANGE":     demoExchange,
		"HTTP_ADDR":    "127.0.0.1:0",
		"SLOT":         demoSlot,
	})
}

// runRelayOnce runs a relay subcommand to completion, its output prefixed.
func runRelayOnce(ctx context.Context, bin string, env []string, subcommand string) error {
	out := newPrefixWriter(os.Stdout, "relay | ")
	defer out.Flush()
	return toolkit.Run(ctx, bin, env, subcommand, out)
}

// startRelay starts a long-running relay subcommand, its output prefixed.
// The demo stops it with Stop (SIGTERM) after its last step, so the relay
// shuts down the way it would in production.
func startRelay(bin string, env []string, subcommand string) (*toolkit.Proc, error) {
	return toolkit.Start(bin, env, subcommand, newPrefixWriter(os.Stdout, "relay | "))
}

// prefixWriter writes each complete line with a prefix, as one Write, so the
// relay's log lines interleave cleanly with the demo's own output.
type prefixWriter struct {
	mu     sync.Mutex
	out    io.Writer
	prefix []byte
	buf    []byte
}

func newPrefixWriter(out io.Writer, prefix string) *prefixWriter {
	return &prefixWriter{out: out, prefix: []byte(prefix)}
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
		if err := w.emit(w.buf[:i+1]); err != nil {
			return len(p), err
		}
		w.buf = w.buf[i+1:]
	}
}

// Flush writes a trailing partial line, if any.
func (w *prefixWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		_ = w.emit(append(w.buf, '\n'))
		w.buf = nil
	}
}

func (w *prefixWriter) emit(line []byte) error {
	_, err := w.out.Write(append(append([]byte(nil), w.prefix...), line...))
	return err
}
