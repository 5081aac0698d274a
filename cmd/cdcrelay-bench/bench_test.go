package main

// These tests cover the bench's pure helpers only. The bench itself takes
// minutes and its figures depend on the machine; it runs with `make bench`,
// never in `make test`, and nothing here asserts anything about time.

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	tests := []struct {
		p    float64
		want time.Duration
	}{
		{0.50, 50 * time.Millisecond},
		{0.99, 99 * time.Millisecond},
		{1.00, 100 * time.Millisecond},
		{0.001, 1 * time.Millisecond},
		{0, 1 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := percentile(d, tt.p); got != tt.want {
			t.Errorf("percentile(1..100 ms, %v) = %v, want %v", tt.p, got, tt.want)
		}
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("percentile(nil) = %v", got)
	}
	if got := percentile([]time.Duration{7}, 0.99); got != 7 {
		t.Errorf("percentile of one value = %v", got)
	}
}

func TestSummarize(t *testing.T) {
	in := []time.Duration{5, 1, 4, 2, 3}
	s := summarize(in)
	if s.n != 5 || s.p50 != 3 || s.p99 != 5 || s.max != 5 {
		t.Fatalf("summary %+v", s)
	}
	if !slices.Equal(in, []time.Duration{5, 1, 4, 2, 3}) {
		t.Fatal("summarize sorted its input in place")
	}
	if s := summarize(nil); s != (summary{}) {
		t.Fatalf("empty summary %+v", s)
	}
}

func TestFormatTable(t *testing.T) {
	got := formatTable([]string{"measure", "relay", "ok"}, [][]string{
		{"drain", "7,900 ev/s", "yes"},
		{"p99 ≤ 10 ms", "3.10 ms"}, // short row, multi-byte rune
	})
	want := "" +
		"| measure     | relay      | ok  |\n" +
		"| ----------- | ---------- | --- |\n" +
		"| drain       | 7,900 ev/s | yes |\n" +
		"| p99 ≤ 10 ms | 3.10 ms    |     |\n"
	if got != want {
		t.Fatalf("table:\n%s\nwant:\n%s", got, want)
	}
}

func TestMissedTargets(t *testing.T) {
	rows := [][]string{{"a", "yes"}, {"b", "NO"}, {"c", ""}, {"d", "NO"}}
	if got := missedTargets(rows); !slices.Equal(got, []string{"b", "d"}) {
		t.Fatalf("missed %v", got)
	}
}

func TestParseProcStat(t *testing.T) {
	// A command name with spaces and parentheses, as postgres backends
	// cannot have but other processes can.
	line := "4242 (postgres: walsender (x) 1) S 4200 4200 4200 0 -1 4194560 1529 0 0 0 731 269 12 8 20 0 1 0 12345 221380608 5000 18446744073709551615 1 1 0 0 0 0 0 4096 536 0 0 0 17 1 0 0 0 0 0"
	st, err := parseProcStat(line)
	if err != nil {
		t.Fatal(err)
	}
	want := procStat{ppid: 4200, utime: 731, stime: 269, cutime: 12, cstime: 8}
	if st != want {
		t.Fatalf("stat %+v, want %+v", st, want)
	}
	if st.cpu() != 10*time.Second || st.reaped() != 200*time.Millisecond {
		t.Fatalf("cpu %v reaped %v", st.cpu(), st.reaped())
	}
	for _, bad := range []string{"", "1 (x) S 2 3", "1 (x) S notanumber 0 0 0 0 0 0 0 0 0 1 2 3 4"} {
		if _, err := parseProcStat(bad); err == nil {
			t.Errorf("parseProcStat(%q): no error", bad)
		}
	}
}

func TestParseVmHWM(t *testing.T) {
	status := "Name:\tcdcrelay\nVmPeak:\t 1900000 kB\nVmHWM:\t   24576 kB\nVmRSS:\t   20000 kB\n"
	got, err := parseVmHWM(status)
	if err != nil || got != 24576*1024 {
		t.Fatalf("VmHWM %d, %v", got, err)
	}
	if _, err := parseVmHWM("Name:\tx\n"); err == nil {
		t.Fatal("no VmHWM: no error")
	}
	if _, err := parseVmHWM("VmHWM:\t12 MB\n"); err == nil {
		t.Fatal("unexpected unit: no error")
	}
}

func TestParseMachineCPU(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	stat := "cpu  100 5 50 800 40 3 2 0 7 0\ncpu0 50 2 25 400 20 1 1 0 0 0\n"
	m, err := parseMachineCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if m.total != 1000 || m.busy != 160 {
		t.Fatalf("machine %+v", m)
	}
	if _, err := parseMachineCPU("intr 1 2 3\n"); err == nil {
		t.Fatal("no cpu line: no error")
	}
	a, b := machineCPU{busy: 100, total: 1000}, machineCPU{busy: 400, total: 1600}
	if got := busyCores(a, b, 2); got != 1 {
		t.Fatalf("busy cores %v, want 1", got)
	}
	if got := busyCores(b, b, 2); got != 0 {
		t.Fatalf("busy cores over no time %v", got)
	}
}

func TestParseCPUModel(t *testing.T) {
	info := "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu\n"
	if got := parseCPUModel(info); got != "Intel(R) Xeon(R) Processor" {
		t.Fatalf("model %q", got)
	}
	if got := parseCPUModel(""); got != "unknown" {
		t.Fatalf("model %q", got)
	}
}

func TestParsePhases(t *testing.T) {
	got, err := parsePhases(defaultPhases)
	if err != nil {
		t.Fatal(err)
	}
	want := []latencyPhase{{1000, 1, 10 * time.Millisecond}, {5000, 10, 50 * time.Millisecond}}
	if !slices.Equal(got, want) {
		t.Fatalf("phases %+v", got)
	}
	if got, err := parsePhases("3000x10"); err != nil || got[0].p99Target != 0 {
		t.Fatalf("phase without a target: %+v %v", got, err)
	}
	for _, bad := range []string{"", "1000", "x10", "1000x0", "10x100", "1000x1,"} {
		if _, err := parsePhases(bad); err == nil {
			t.Errorf("parsePhases(%q): no error", bad)
		}
	}
	if iv := (latencyPhase{rate: 5000, perTx: 10}).pacer().interval; iv != 2*time.Millisecond {
		t.Fatalf("5,000 ev/s in 10s: tick every %v, want 2ms", iv)
	}
}

func TestFormatting(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 100000: "100,000", -1234567: "-1,234,567"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
	for d, want := range map[time.Duration]string{
		1234 * time.Microsecond: "1.23 ms", 46300 * time.Microsecond: "46.3 ms", 3812 * time.Millisecond: "3,812 ms",
	} {
		if got := ms(d); got != want {
			t.Errorf("ms(%v) = %q, want %q", d, got, want)
		}
	}
	if got := ratio(1, 0); got != "n/a" {
		t.Errorf("ratio(1, 0) = %q", got)
	}
	if got := ratio(7100, 7900); got != "0.90" {
		t.Errorf("ratio = %q", got)
	}
	if got := mib(64 << 20); got != "64.0 MiB" {
		t.Errorf("mib = %q", got)
	}
	if got := okIf(false, false); got != "" {
		t.Errorf("no target: %q", got)
	}
}

func TestIdleAllowance(t *testing.T) {
	for w, want := range map[time.Duration]int64{5 * time.Second: 1, 15 * time.Second: 2, 31 * time.Second: 3} {
		if got := (idleResult{window: w}).allowed(); got != want {
			t.Errorf("window %v allows %d monitor queries, want %d", w, got, want)
		}
	}
}

func TestRelayEnv(t *testing.T) {
	t.Setenv("CDCRELAY_EXCHANGE", "theirs")
	t.Setenv("CDCRELAY_PUBLISH_CHANNELS", "4")
	t.Setenv("CDCRELAY_AMQP_TLS_KEY", "/secret/key.pem")
	set := map[string]string{"EXCHANGE": "ours", "LOG_LEVEL": "warn"}
	env := relayEnv(set)
	if slices.Contains(env, "CDCRELAY_EXCHANGE=theirs") || !slices.Contains(env, "CDCRELAY_EXCHANGE=ours") ||
		!slices.Contains(env, "CDCRELAY_PUBLISH_CHANNELS=4") {
		t.Fatalf("env %v", env)
	}
	passed := strings.Join(passedThrough(set), " ")
	if !strings.Contains(passed, "CDCRELAY_PUBLISH_CHANNELS=4") || strings.Contains(passed, "EXCHANGE") ||
		strings.Contains(passed, "/secret") || !strings.Contains(passed, "CDCRELAY_AMQP_TLS_KEY=<redacted>") {
		t.Fatalf("passed through: %s", passed)
	}
}

func TestListenInode(t *testing.T) {
	tcp := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n" +
		"   4: 0100007F:1628 00000000:0000 0A 00000000:00000000 00:00000000 00000000   106        0 5607 1 0000000099417d63 100 0 0 10 0\n" +
		"  18: 0100007F:1628 0100007F:B154 01 00000000:00000000 00:00000000 00000000   106        0 156614 1 000000007e5f46f3 20 4 31 18 -1\n"
	if inode, ok := listenInode(tcp, 5672); !ok || inode != "5607" {
		t.Fatalf("inode %q %v, want the LISTEN socket 5607", inode, ok)
	}
	if _, ok := listenInode(tcp, 5432); ok {
		t.Fatal("found a listener on a port nobody listens on")
	}
}
