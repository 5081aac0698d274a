package brokernode

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/svckit"
)

// RabbitMQBinEnv overrides the directory holding rabbitmq-server and
// rabbitmqctl (the scripts themselves, not the /usr/sbin wrappers that switch
// to the rabbitmq user).
const RabbitMQBinEnv = "CDCRELAY_RABBITMQ_BIN"

// rabbitmqBinDirs are where Debian/Ubuntu and the generic Unix package put
// the server scripts.
var rabbitmqBinDirs = []string{"/usr/lib/rabbitmq/bin", "/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin"}

// rabbitmqLogName is the node's log file inside the log directory.
const rabbitmqLogName = "rabbit.log"

// RabbitMQOptions tunes a private broker node.
type RabbitMQOptions struct {
	// Config holds extra rabbitmq.conf settings (new-style keys), e.g.
	// "vm_memory_high_watermark.relative": "0.4". They override the defaults
	// this package applies.
	Config map[string]string
	// Log, when not nil, receives the node's log if startup fails.
	Log io.Writer
	// Cookie is the node's Erlang cookie; empty means a random one. Nodes
	// that form a cluster (StartRabbitMQCluster) share one.
	Cookie string
}

// RabbitMQ is a private broker node owned by the caller: its own Erlang
// node name, AMQP and distribution ports, data (mnesia) directory, cookie
// and an empty plugin list, so a test can stop, restart or throttle it
// without touching the machine's shared broker. Its methods are safe for
// concurrent use; Stop, Start, Kill and Close serialise.
//
// The node runs as the current user, root included (unlike PostgreSQL,
// RabbitMQ does not refuse it). It registers with the machine's epmd, which
// it starts if none runs.
type RabbitMQ struct {
	binDir   string
	dir      string // removed by Close
	node     string // name@localhost, unique
	port     int    // AMQP, stable across restarts
	distPort int
	config   map[string]string
	cookie   string

	mu     sync.Mutex // serialises Start/Stop/Kill/Close
	proc   *exec.Cmd
	exited chan struct{} // closed when proc has been reaped
	closed bool
}

// StartRabbitMQ creates a node in a temporary directory, starts it on a
// free 127.0.0.1 port and returns once it accepts AMQP connections (guest /
// guest). The caller must Close it.
func StartRabbitMQ(ctx context.Context, opts RabbitMQOptions) (*RabbitMQ, error) {
	binDir, err := findRabbitMQBinDir()
	if err != nil {
		return nil, fmt.Errorf("start rabbitmq: %w", err)
	}
	dir, err := os.MkdirTemp(shortTempDir(), "cdcrelay-rmq-")
	if err != nil {
		return nil, fmt.Errorf("start rabbitmq: create dir: %w", err)
	}
	r := &RabbitMQ{
		binDir: binDir,
		dir:    dir,
		node:   svckit.UniqueName("cdcrelay_test") + "@localhost",
		config: opts.Config,
		cookie: opts.Cookie,
	}
	if r.cookie == "" {
		r.cookie = randomCookie()
	}
	if err := r.setup(ctx); err != nil {
		if opts.Log != nil {
			fmt.Fprintf(opts.Log, "--- rabbitmq log (%s) ---\n%s\n--- end of rabbitmq log ---\n", r.dir, r.ServerLog())
		}
		_ = r.Close()
		return nil, fmt.Errorf("start rabbitmq: %w", err)
	}
	return r, nil
}

func (r *RabbitMQ) setup(ctx context.Context) error {
	for _, d := range []string{"home", "mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(r.dir, d), 0o700); err != nil {
			return err
		}
	}
	// A private cookie in a private HOME: the node and the rabbitmqctl calls
	// below share it, and nothing else can talk to the node.
	if err := os.WriteFile(filepath.Join(r.dir, "home", ".erlang.cookie"), []byte(r.cookie), 0o400); err != nil {
		return fmt.Errorf("write cookie: %w", err)
	}
	// No plugins, and no /etc/rabbitmq/rabbitmq-env.conf (it names the
	// shared node).
	if err := os.WriteFile(filepath.Join(r.dir, "enabled_plugins"), []byte("[].\n"), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(r.dir, "rabbitmq-env.conf"), nil, 0o600); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var lastErr error
	for range svckit.PortAttempts {
		var err error
		if r.port, err = svckit.FreePort(); err != nil {
			return err
		}
		if r.distPort, err = svckit.FreePort(); err != nil {
			return err
		}
		if r.distPort == r.port {
			continue
		}
		if err := r.writeConfig(); err != nil {
			return err
		}
		logBefore := len(r.ServerLog())
		lastErr = r.startLocked(ctx)
		if lastErr == nil {
			return nil
		}
		if ctx.Err() != nil || !strings.Contains(r.ServerLog()[logBefore:], "eaddrinuse") {
			return lastErr
		}
		// Someone took a port between probing and binding: start afresh.
		_ = os.RemoveAll(filepath.Join(r.dir, "mnesia"))
		_ = os.MkdirAll(filepath.Join(r.dir, "mnesia"), 0o700)
	}
	return fmt.Errorf("no free ports after %d attempts: %w", svckit.PortAttempts, lastErr)
}

// env is the environment of the node and of rabbitmqctl.
func (r *RabbitMQ) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "RABBITMQ_") || strings.HasPrefix(kv, "ERL_") || strings.HasPrefix(kv, "HOME=") ||
			strings.HasPrefix(kv, "LC_ALL=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"HOME="+filepath.Join(r.dir, "home"),
		"LC_ALL=C.UTF-8",
		"RABBITMQ_NODENAME="+r.node,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(r.port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(r.distPort),
		"RABBITMQ_CONF_ENV_FILE="+filepath.Join(r.dir, "rabbitmq-env.conf"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(r.dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(r.dir, "advanced.config"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(r.dir, "enabled_plugins"),
		"RABBITMQ_PLUGINS_EXPAND_DIR="+filepath.Join(r.dir, "plugins-expand"),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(r.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(r.dir, "log"),
		"RABBITMQ_LOGS="+filepath.Join(r.dir, "log", rabbitmqLogName),
		"RABBITMQ_PID_FILE="+filepath.Join(r.dir, "rabbit.pid"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"ERL_FLAGS=-kernel inet_dist_use_interface {127,0,0,1}",
	)
}

// startLocked launches the node and waits until it accepts AMQP
// connections. r.mu must be held.
func (r *RabbitMQ) startLocked(ctx context.Context) error {
	r.reapLocked()
	if r.proc != nil {
		return errors.New("already running")
	}
	out, err := os.OpenFile(filepath.Join(r.dir, "log", "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(r.binDir, "rabbitmq-server"))
	cmd.Dir = r.dir
	cmd.Env = r.env()
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so Kill and Close can end the node and its
	// helpers (erl_child_setup, inet_gethost, the disk monitor) together.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return fmt.Errorf("run rabbitmq-server: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = out.Close()
		close(exited)
	}()
	r.proc, r.exited = cmd, exited
	if err := r.waitReady(ctx); err != nil {
		r.killLocked()
		return fmt.Errorf("node %s on port %d: %w\nlog tail:\n%s", r.node, r.port, err, svckit.Tail(r.ServerLog(), 20))
	}
	return nil
}

func (r *RabbitMQ) waitReady(ctx context.Context) error {
	for {
		select {
		case <-r.exited:
			return errors.New("rabbitmq-server exited during startup")
		default:
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := CheckAMQP(actx, r.URL())
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not accepting AMQP connections: %w (last error: %w)", ctx.Err(), err)
		case <-r.exited:
			return errors.New("rabbitmq-server exited during startup")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// URL is the node's AMQP URL with the stock guest account.
func (r *RabbitMQ) URL() string { return "amqp://guest:guest@" + r.Addr() + "/" }

// Addr is "127.0.0.1:PORT" of the AMQP listener, for a fault proxy.
func (r *RabbitMQ) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// Port is the AMQP port (stable across restarts).
func (r *RabbitMQ) Port() int { return r.port }

// Node is the Erlang node name, for rabbitmqctl -n.
func (r *RabbitMQ) Node() string { return r.node }

// Dir is the node's directory (data, logs, config).
func (r *RabbitMQ) Dir() string { return r.dir }

// Running reports whether the node's process is alive.
func (r *RabbitMQ) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reapLocked()
	return r.proc != nil
}

// reapLocked forgets a process that ended on its own. r.mu must be held.
func (r *RabbitMQ) reapLocked() {
	if r.proc == nil {
		return
	}
	select {
	case <-r.exited:
		r.proc = nil
	default:
	}
}

// ServerLog returns the node's log so far, followed by whatever the server
// script printed ("" if nothing yet).
func (r *RabbitMQ) ServerLog() string {
	var b strings.Builder
	for _, name := range []string{rabbitmqLogName, "stdout.log"} {
		if data, err := os.ReadFile(filepath.Join(r.dir, "log", name)); err == nil {
			b.Write(data)
		}
	}
	return b.String()
}

// Stop stops the node for real (rabbitmqctl stop: connections are closed,
// the Erlang VM halts) and waits until its process is gone. Durable queues
// and persistent messages stay in the data directory for Start. If the node
// does not stop before ctx ends, it is killed.
func (r *RabbitMQ) Stop(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reapLocked()
	if r.proc == nil {
		return nil
	}
	_, ctlErr := r.ctl(ctx, "stop")
	select {
	case <-r.exited:
		r.proc = nil
		return nil
	case <-ctx.Done():
	}
	r.killLocked()
	if ctlErr != nil {
		return fmt.Errorf("stop rabbitmq node %s (killed it instead): %w", r.node, ctlErr)
	}
	return fmt.Errorf("stop rabbitmq node %s: did not stop in time, killed it: %w", r.node, ctx.Err())
}

// Kill ends the node with SIGKILL, as a crash would, and waits until it is
// gone.
func (r *RabbitMQ) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.killLocked()
}

func (r *RabbitMQ) killLocked() {
	if r.proc == nil {
		return
	}
	// The negative pid is the node's own process group (Setpgid above).
	_ = syscall.Kill(-r.proc.Process.Pid, syscall.SIGKILL)
	<-r.exited
	r.proc = nil
}

// Start starts a stopped node again on the same port with the same data
// directory, and waits until it accepts AMQP connections.
func (r *RabbitMQ) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("start rabbitmq: closed")
	}
	if err := r.startLocked(ctx); err != nil {
		return fmt.Errorf("start rabbitmq: %w", err)
	}
	return nil
}

// SetMemoryHighWatermark runs rabbitmqctl set_vm_memory_high_watermark on
// the node. 0 raises the memory alarm at once, which blocks every
// publishing connection; 0.4 is RabbitMQ's default.
func (r *RabbitMQ) SetMemoryHighWatermark(ctx context.Context, fraction float64) error {
	_, err := r.Ctl(ctx, "set_vm_memory_high_watermark", strconv.FormatFloat(fraction, 'f', -1, 64))
	return err
}

// Ctl runs rabbitmqctl against the node and returns its output.
func (r *RabbitMQ) Ctl(ctx context.Context, args ...string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reapLocked()
	if r.proc == nil {
		return "", fmt.Errorf("rabbitmqctl %s: node %s is not running", strings.Join(args, " "), r.node)
	}
	return r.ctl(ctx, args...)
}

// ctl runs rabbitmqctl; it does not need r.mu but callers that change the
// node's state hold it.
func (r *RabbitMQ) ctl(ctx context.Context, args ...string) (string, error) {
	full := append([]string{"-n", r.node, "-q"}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(r.binDir, "rabbitmqctl"), full...)
	cmd.Dir = r.dir
	cmd.Env = r.env()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("rabbitmqctl %s: %w\noutput:\n%s", strings.Join(args, " "), err, svckit.Tail(out.String(), 20))
	}
	return out.String(), nil
}

// Close kills the node and removes its directory. It is safe to call more
// than once and after a failed test: nothing of the node survives it. A
// clean stop would buy nothing, as the data goes with the directory, and
// costs a rabbitmqctl run: an Erlang VM start that took over 15 s on two
// busy cores while other suites ran.
func (r *RabbitMQ) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.killLocked()
	r.closed = true
	if err := os.RemoveAll(r.dir); err != nil {
		return fmt.Errorf("remove rabbitmq dir: %w", err)
	}
	return nil
}

// findRabbitMQBinDir returns $CDCRELAY_RABBITMQ_BIN or the first known
// directory that holds rabbitmq-server and rabbitmqctl.
func findRabbitMQBinDir() (string, error) {
	if dir := os.Getenv(RabbitMQBinEnv); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "rabbitmq-server")); err != nil {
			return "", fmt.Errorf("%s=%s has no rabbitmq-server: %w", RabbitMQBinEnv, dir, err)
		}
		return dir, nil
	}
	for _, pattern := range rabbitmqBinDirs {
		dirs, _ := filepath.Glob(pattern)
		sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
		for _, d := range dirs {
			_, e1 := os.Stat(filepath.Join(d, "rabbitmq-server"))
			_, e2 := os.Stat(filepath.Join(d, "rabbitmqctl"))
			if e1 == nil && e2 == nil {
				return d, nil
			}
		}
	}
	return "", fmt.Errorf("no RabbitMQ server scripts in %s (install rabbitmq-server, or set %s to the directory holding rabbitmq-server and rabbitmqctl)",
		strings.Join(rabbitmqBinDirs, " or "), RabbitMQBinEnv)
}

// shortTempDir keeps node paths short and readable.
func shortTempDir() string {
	if d := os.TempDir(); len(d) <= 60 {
		return d
	}
	return "/tmp"
}

// randomCookie returns 20 upper-case letters, the shape Erlang generates.
func randomCookie() string {
	var b [20]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = 'A' + b[i]%26
	}
	return string(b[:])
}
