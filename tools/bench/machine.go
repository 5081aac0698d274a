package main

// The report's header: the machine, the relay build, load average, and the
// broker's process.

import (
	"debug/buildinfo"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

// findBroker returns the pid of the local process listening on the
// broker URL's port (the broker's Erlang VM), or 0 when there is none (a
// remote broker): its CPU is then counted in "rest".
func findBroker(amqpURL string) int {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return 0
	}
	port := 5672
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil {
			return 0
		}
	}
	if h := u.Hostname(); h != "127.0.0.1" && h != "localhost" && h != "::1" {
		return 0
	}
	pid, err := listenerPID(port)
	if err != nil {
		return 0
	}
	return pid
}

// machineInfo is the report's header.
type machineInfo struct {
	date      time.Time
	cpus      int
	model     string
	kernel    string
	memory    string
	goBench   string
	goRelay   string
	postgres  string
	broker    string // product and version from the broker's handshake (brokerName)
	brokerAt  string // its URL, password redacted
	brokerBy  string // what chose it: the flag, a variable or the default
	loadStart string
	loadEnd   string
}

func readMachine(relay string) machineInfo {
	m := machineInfo{date: time.Now().UTC(), cpus: runtime.NumCPU(), goBench: runtime.Version(), model: "unknown",
		kernel: "unknown", memory: "unknown", goRelay: "unknown", postgres: "unknown", broker: "unknown", loadStart: readLoadAvg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		m.model = parseCPUModel(string(b))
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		if f := strings.Fields(line); len(f) == 3 {
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				m.memory = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
			}
		}
	}
	if info, err := buildInfo(relay); err == nil {
		m.goRelay = info
	}
	return m
}

func buildInfo(path string) (string, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return "", err
	}
	return bi.GoVersion, nil
}

func readLoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// printSeries shows a phase's latency second by second (-v), to tell a
// steady queue from one that grows or from a few stalls.
func printSeries(start, at map[string]time.Time) {
	var t0 time.Time
	for _, t := range start {
		if t0.IsZero() || t.Before(t0) {
			t0 = t
		}
	}
	buckets := map[int][]time.Duration{}
	last := 0
	for id, t := range start {
		sec := int(t.Sub(t0) / time.Second)
		buckets[sec] = append(buckets[sec], at[id].Sub(t))
		last = max(last, sec)
	}
	for sec := 0; sec <= last; sec++ {
		s := summarize(buckets[sec])
		say("    second %2d: %5d events  p50 %-9s p99 %-9s max %s", sec, s.n, toolkit.Ms(s.p50), toolkit.Ms(s.p99), toolkit.Ms(s.max))
	}
}
