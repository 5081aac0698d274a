package brokernode

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/svckit"
)

// RabbitMQManagement is a private broker node with the management plugin
// (rabbitmq_management, shipped with Debian's rabbitmq-server) listening on
// a free 127.0.0.1 port of its own, for tests of what only the HTTP API can
// tell: bindings, queue arguments, policies.
type RabbitMQManagement struct {
	*RabbitMQ
	httpPort int
}

// ManagementURL is the HTTP API's base URL with the stock guest account
// (guest may log in from localhost only, which is where the node listens).
func (m *RabbitMQManagement) ManagementURL() string {
	return "http://guest:guest@127.0.0.1:" + strconv.Itoa(m.httpPort)
}

// StartRabbitMQManagement starts a private node (StartRabbitMQ) whose
// configuration also puts the management listener on a free port, then
// enables the plugin on the running node and waits until the API answers.
// Enabling it online, rather than listing it before the first boot, leaves
// rabbitmq.go's empty plugin list as it is for every other node.
func StartRabbitMQManagement(ctx context.Context, opts RabbitMQOptions) (*RabbitMQManagement, error) {
	httpPort, err := svckit.FreePort()
	if err != nil {
		return nil, fmt.Errorf("start rabbitmq with management: %w", err)
	}
	settings := map[string]string{
		"management.tcp.port": strconv.Itoa(httpPort),
		"management.tcp.ip":   "127.0.0.1",
	}
	for k, v := range opts.Config {
		settings[k] = v
	}
	opts.Config = settings
	r, err := StartRabbitMQ(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("start rabbitmq with management: %w", err)
	}
	m := &RabbitMQManagement{RabbitMQ: r, httpPort: httpPort}
	if err := m.enable(ctx); err != nil {
		if opts.Log != nil {
			fmt.Fprintf(opts.Log, "--- rabbitmq log (%s) ---\n%s\n--- end of rabbitmq log ---\n", r.Dir(), r.ServerLog())
		}
		_ = r.Close()
		return nil, fmt.Errorf("start rabbitmq with management on port %d: %w", httpPort, err)
	}
	return m, nil
}

// enable runs rabbitmq-plugins against the node, with the node's own
// environment so it edits the node's private enabled_plugins file, and
// waits until the API answers an authenticated request.
func (m *RabbitMQManagement) enable(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, filepath.Join(m.binDir, "rabbitmq-plugins"), "-n", m.node, "-q", "enable", "rabbitmq_management")
	cmd.Dir = m.dir
	cmd.Env = m.env()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("rabbitmq-plugins enable rabbitmq_management: %w\noutput:\n%s", err, svckit.Tail(out.String(), 20))
	}
	client := &http.Client{Timeout: 2 * time.Second}
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(m.httpPort)+"/api/overview", nil)
		if err != nil {
			return err
		}
		req.SetBasicAuth("guest", "guest")
		resp, err := client.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET /api/overview: %s", resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("management API not answering: %w (last error: %w)", ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
