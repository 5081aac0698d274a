//go:build faults

package faults_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// Helpers only the slow (build tag faults) tests use.

// connect opens another direct connection to the test's database (after a
// server restart), closed when the test ends.
func (w *world) connect() *pgx.Conn {
	w.t.Helper()
	return relaytest.Connect(w.t, w.dbURL)
}

// --- the relay binary ---

// process is the relay binary running as a child process.
type process struct {
	*testenv.Process
	httpAddr string
}

type processOptions struct {
	Race  bool   // build with -race
	Tags  string // build tags
	Extra map[string]string
	Env   []string // extra raw environment (e.g. CDCRELAY_FAILPOINT=...)
}

func (w *world) startProcess(o processOptions) *process {
	w.t.Helper()
	bin := builds.Relay(w.t, o.Race, o.Tags)
	port, err := freePort()
	if err != nil {
		w.t.Fatal(err)
	}
	extra := map[string]string{"HTTP_ADDR": "127.0.0.1:" + strconv.Itoa(port)}
	for k, v := range o.Extra {
		extra[k] = v
	}
	env := append(relaytest.Environ(w.vars(extra)), o.Env...)
	return &process{Process: testenv.StartProcess(w.t, bin, env, "run"), httpAddr: "127.0.0.1:" + strconv.Itoa(port)}
}

// kill sends SIGKILL and waits for the process to end.
func (p *process) kill(t *testing.T) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
	if err := p.Wait(t, 10*time.Second); !killed(err) {
		t.Fatalf("relay exit after SIGKILL: %v", err)
	}
}

// metrics scrapes the process's /metrics and returns name -> summed value
// for the families asked for.
func (p *process) metrics(names ...string) (map[string]float64, error) {
	resp, err := http.Get("http://" + p.httpAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		for _, n := range names {
			if line == "" || !strings.HasPrefix(line, n) {
				continue
			}
			rest := line[len(n):]
			if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
				continue
			}
			f := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
			if len(f) == 0 {
				continue
			}
			if v, err := strconv.ParseFloat(f[0], 64); err == nil {
				out[n] += v
			}
		}
	}
	return out, nil
}

// waitEvents waits until the loader has committed at least n events.
func (l *loader) waitEvents(t *testing.T, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for l.count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("loader: %d of %d events after %s", l.count(), n, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFor polls cond every 20ms.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// killed reports whether err is the exit of a process killed by SIGKILL.
func killed(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}
