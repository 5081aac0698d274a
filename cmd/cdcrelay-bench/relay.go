package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// relayProc is a running `cdcrelay run`.
type relayProc struct {
	cmd     *exec.Cmd
	started time.Time
	exited  chan struct{} // closed when the process has exited
	err     error         // exit error; read only after exited is closed
	log     *lockedBuffer
}

// startRelay starts `bin run` with env. Its log (LOG_LEVEL=warn, so
// normally empty) is kept and shown if the bench fails.
func startRelay(bin string, env []string) (*relayProc, error) {
	r := &relayProc{exited: make(chan struct{}), log: &lockedBuffer{}}
	r.cmd = exec.Command(bin, "run")
	r.cmd.Env = env
	r.cmd.Stdout, r.cmd.Stderr = r.log, r.log
	r.cmd.SysProcAttr = relaySysProcAttr()
	r.started = time.Now()
	if err := r.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s run: %w", bin, err)
	}
	go func() {
		r.err = r.cmd.Wait()
		close(r.exited)
	}()
	return r, nil
}

func (r *relayProc) pid() int { return r.cmd.Process.Pid }

// stop sends SIGTERM and waits for a graceful exit, killing the relay if
// it takes longer than ctx allows.
func (r *relayProc) stop(ctx context.Context) error {
	select {
	case <-r.exited:
		return r.exitError()
	default:
	}
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal relay: %w", err)
	}
	select {
	case <-r.exited:
		return r.exitError()
	case <-ctx.Done():
		_ = r.cmd.Process.Kill()
		<-r.exited
		return fmt.Errorf("relay did not stop after SIGTERM, killed it: %w", ctx.Err())
	}
}

func (r *relayProc) exitError() error {
	if r.err != nil {
		return fmt.Errorf("%w: %w\nrelay log:\n%s", errStopped, r.err, tail(r.log.String(), 30))
	}
	return nil
}

// relayEnv is the relay's configuration: the bench's CDCRELAY_* settings
// win over the caller's environment; other CDCRELAY_* variables the caller
// sets pass through (and are listed in the report).
func relayEnv(set map[string]string) []string {
	env := make([]string, 0, len(os.Environ())+len(set))
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ours := set[strings.TrimPrefix(k, "CDCRELAY_")]; ours && strings.HasPrefix(k, "CDCRELAY_") {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range set {
		env = append(env, "CDCRELAY_"+k+"="+v)
	}
	return env
}

// passedThrough lists the caller's CDCRELAY_* variables the bench does not
// set itself, so a report says when the relay ran with non-default tuning.
func passedThrough(set map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		name, ok := strings.CutPrefix(k, "CDCRELAY_")
		if !ok || strings.HasPrefix(k, "CDCRELAY_TEST_") || name == "PG_BIN" || name == "RABBITMQ_BIN" {
			continue
		}
		if _, ours := set[name]; ours {
			continue
		}
		if strings.Contains(name, "URL") || strings.Contains(name, "KEY") {
			kv = k + "=<redacted>"
		}
		out = append(out, kv)
	}
	return out
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func tail(s string, lines int) string {
	parts := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(parts[max(0, len(parts)-lines):], "\n")
}
