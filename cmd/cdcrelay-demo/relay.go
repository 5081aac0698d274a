package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
)

// relayEnv is the relay's configuration for the demo. Later entries win over
// anything the user's environment already sets, other CDCRELAY_* variables
// (e.g. CDCRELAY_LOG_LEVEL) pass through.
func relayEnv(dbURL, amqpURL string) []string {
	return append(os.Environ(),
		"CDCRELAY_DATABASE_URL="+dbURL,
		"CDCRELAY_AMQP_URL="+amqpURL,
		"CDCRELAY_EXCHANGE="+demoExchange,
		"CDCRELAY_HTTP_ADDR=127.0.0.1:0",
		"CDCRELAY_SLOT="+demoSlot,
	)
}

// relayProcess is a running `cdcrelay run`.
type relayProcess struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has exited
	err    error         // exit error; read only after exited is closed
}

// runRelayOnce runs a relay subcommand to completion, its output prefixed.
func runRelayOnce(ctx context.Context, bin string, env []string, subcommand string) error {
	out := newPrefixWriter(os.Stdout, "relay | ")
	defer out.Flush()
	cmd := exec.CommandContext(ctx, bin, subcommand)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", bin, subcommand, err)
	}
	return nil
}

// startRelay starts a long-running relay subcommand. It is not tied to a
// context: the demo stops it explicitly with SIGTERM, after its last step,
// so the relay shuts down the way it would in production.
func startRelay(bin string, env []string, subcommand string) (*relayProcess, error) {
	out := newPrefixWriter(os.Stdout, "relay | ")
	cmd := exec.Command(bin, subcommand)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = relaySysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s %s: %w", bin, subcommand, err)
	}
	r := &relayProcess{cmd: cmd, exited: make(chan struct{})}
	go func() {
		r.err = cmd.Wait()
		out.Flush()
		close(r.exited)
	}()
	return r, nil
}

// stop sends SIGTERM and waits for the relay to exit, killing it if it does
// not stop before ctx ends.
func (r *relayProcess) stop(ctx context.Context) error {
	select {
	case <-r.exited:
		return nil // already gone; its exit was reported where it mattered
	default:
	}
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal relay: %w", err)
	}
	select {
	case <-r.exited:
		return nil
	case <-ctx.Done():
		_ = r.cmd.Process.Kill()
		<-r.exited
		return fmt.Errorf("relay did not stop after SIGTERM, killed it: %w", ctx.Err())
	}
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
