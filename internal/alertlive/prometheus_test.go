//go:build alerts

package alertlive_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// prom is a Prometheus server the test started and queries over its HTTP API.
type prom struct {
	base string // http://127.0.0.1:PORT
	proc *testenv.Process
}

// promConfig scrapes target every second with the labels the chart's rules
// select on (the default selector matches namespace and service, as a
// ServiceMonitor attaches them; source is what its relabeling adds) and
// evaluates the rules every second.
const promConfig = `global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: cdcrelay
    metrics_path: /metrics
    static_configs:
      - targets: [%q]
        labels: {namespace: %q, service: %q, source: default}
`

// startPrometheus runs prometheus on a free port with its storage in a
// temporary directory; the test's cleanup kills it.
func startPrometheus(t *testing.T, tl tools, target, rules string) *prom {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	body := fmt.Sprintf(promConfig, rules, target, ruleNamespace, releaseName)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	proc := testenv.StartProcess(t, tl.prometheus, os.Environ(),
		"--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	p := &prom{base: "http://" + addr, proc: proc}
	p.waitFor(t, time.Minute, "Prometheus ready", p.ready)
	return p
}

func (p *prom) ready() (bool, error) {
	resp, err := http.Get(p.base + "/-/ready")
	if err == nil {
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}
	return false, nil // not listening yet: keep polling
}

// get decodes the data field of an API answer into out.
func (p *prom) get(path string, query url.Values, out any) error {
	resp, err := http.Get(p.base + path + "?" + query.Encode())
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return fmt.Errorf("GET %s: decode: %w", path, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("GET %s: %s: %s", path, env.Status, env.Error)
	}
	if err := json.Unmarshal(env.Data, out); err != nil {
		return fmt.Errorf("GET %s: decode data: %w", path, err)
	}
	return nil
}

// alert is one entry of /api/v1/alerts: pending or firing (Prometheus
// drops resolved alerts from this list).
type alert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// alerts returns the active alerts named name.
func (p *prom) alerts(name string) ([]alert, error) {
	var data struct {
		Alerts []alert `json:"alerts"`
	}
	if err := p.get("/api/v1/alerts", nil, &data); err != nil {
		return nil, err
	}
	var out []alert
	for _, a := range data.Alerts {
		if a.Labels["alertname"] == name {
			out = append(out, a)
		}
	}
	return out, nil
}

// query returns how many series an instant query yields.
func (p *prom) query(q string) (int, error) {
	var data struct {
		Result []json.RawMessage `json:"result"`
	}
	if err := p.get("/api/v1/query", url.Values{"query": {q}}, &data); err != nil {
		return 0, err
	}
	return len(data.Result), nil
}

// alertingRules returns the health of each loaded alerting rule by name
// (a name that several rules share is "ok" only if each is).
func (p *prom) alertingRules() (map[string]string, error) {
	var data struct {
		Groups []struct {
			Rules []struct {
				Name      string `json:"name"`
				Type      string `json:"type"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get("/api/v1/rules", url.Values{"type": {"alert"}}, &data); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, g := range data.Groups {
		for _, r := range g.Rules {
			h := r.Health
			if r.LastError != "" {
				h += ": " + r.LastError
			}
			if prev, ok := out[r.Name]; !ok || prev == "ok" {
				out[r.Name] = h
			}
		}
	}
	return out, nil
}

// waitFor polls cond every 250 ms until it holds; an error from cond or
// the deadline fails the test, as does Prometheus exiting.
func (p *prom) waitFor(t *testing.T, within time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if exited, err := p.proc.Exited(); exited {
			t.Fatalf("prometheus exited (%v) while waiting for %s", err, what)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %s", what, within)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
