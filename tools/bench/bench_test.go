package main

// These tests cover the bench's pure helpers only. The bench itself takes
// minutes and its figures depend on the machine; it runs with `make bench`,
// never in `make test`, and nothing here asserts anything about time.

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

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
	want := []latencyPhase{{1000, 1, phaseTargets{1.5, 100 * time.Microsecond}}, {5000, 10, phaseTargets{2, 25 * time.Microsecond}}}
	if !slices.Equal(got, want) {
		t.Fatalf("phases %+v", got)
	}
	if got, err := parsePhases("3000x10"); err != nil || got[0].targets != (phaseTargets{}) {
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
	if got := ratio(1, 0); got != "n/a" {
		t.Errorf("ratio(1, 0) = %q", got)
	}
	if got := ratio(7100, 7900); got != "0.90" {
		t.Errorf("ratio = %q", got)
	}
	if got := mib(64 << 20); got != "64.0 MiB" {
		t.Errorf("mib = %q", got)
	}
	if got := us(22500 * time.Nanosecond); got != "22.5 µs" {
		t.Errorf("us = %q", got)
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
	env := toolkit.Env(set)
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

func TestLaneKeys(t *testing.T) {
	for _, tt := range []struct{ n, perLane int }{{1, 1}, {2, 4}, {3, 4}, {4, 4}, {5, 2}, {8, 4}, {16, 4}, {maxChannels, keysPerLane}} {
		lanes, err := laneKeys(tt.n, tt.perLane)
		if err != nil {
			t.Fatalf("laneKeys(%d, %d): %v", tt.n, tt.perLane, err)
		}
		if len(lanes) != tt.n {
			t.Fatalf("laneKeys(%d, %d): %d lanes", tt.n, tt.perLane, len(lanes))
		}
		seen := map[string]bool{}
		for i, keys := range lanes {
			if len(keys) != tt.perLane {
				t.Errorf("n=%d: lane %d has %d keys %v, want %d", tt.n, i, len(keys), keys, tt.perLane)
			}
			for _, k := range keys {
				if got := publish.LaneOf(k, tt.n); got != i {
					t.Errorf("n=%d: key %q listed for lane %d, LaneOf says %d", tt.n, k, i, got)
				}
				if seen[k] {
					t.Errorf("n=%d: key %q twice", tt.n, k)
				}
				seen[k] = true
				// The main queue's binding (bench.order.#) must not match.
				if !strings.HasPrefix(k, "bench.part.") || strings.HasPrefix(k, strings.TrimSuffix(mainBinding, "#")) {
					t.Errorf("key %q: want bench.part.*, outside %s", k, mainBinding)
				}
			}
		}
	}
	for _, bad := range [][2]int{{0, 4}, {4, 0}, {-1, 1}} {
		if _, err := laneKeys(bad[0], bad[1]); err == nil {
			t.Errorf("laneKeys(%d, %d): no error", bad[0], bad[1])
		}
	}
}

func TestInterleave(t *testing.T) {
	tests := []struct {
		lanes [][]string
		want  []string
	}{
		{nil, nil},
		{[][]string{{"a"}}, []string{"a"}},
		{[][]string{{"a0", "a1"}, {"b0", "b1"}, {"c0", "c1"}}, []string{"a0", "b0", "c0", "a1", "b1", "c1"}},
		{[][]string{{"a0", "a1", "a2"}, {"b0"}}, []string{"a0", "b0", "a1", "a2"}},
	}
	for _, tt := range tests {
		if got := interleave(tt.lanes); !slices.Equal(got, tt.want) {
			t.Errorf("interleave(%v) = %v, want %v", tt.lanes, got, tt.want)
		}
	}
	// Round-robin over the interleaved keys deals every lane the same
	// share of any whole number of rounds.
	const n = 4
	lanes, err := laneKeys(n, keysPerLane)
	if err != nil {
		t.Fatal(err)
	}
	keys := interleave(lanes)
	perLane := make([]int, n)
	for g := range 10 * len(keys) {
		perLane[publish.LaneOf(keys[g%len(keys)], n)]++
	}
	for i, c := range perLane {
		if c != 10*keysPerLane {
			t.Errorf("lane %d got %d events of %d, want %d", i, c, 10*len(keys), 10*keysPerLane)
		}
	}
}

func TestPartitionedRows(t *testing.T) {
	ceiling := rateResult{events: 10_000, took: time.Second}
	row := func(rows [][]string, prefix string) []string {
		for _, r := range rows {
			if strings.HasPrefix(r[0], prefix) {
				return r
			}
		}
		return nil
	}
	tests := []struct {
		channels  int
		one, many time.Duration // time to drain 10,000 events
		ratio, ok string
	}{
		{4, 2 * time.Second, time.Second, "2.00", "yes"},
		{4, 2 * time.Second, 1600 * time.Millisecond, "1.25", "NO"},
		{2, 1300 * time.Millisecond, time.Second, "1.30", "yes"},
		{0, 0, 0, "", ""},
		{1, 0, 0, "", ""},
	}
	for _, tt := range tests {
		r := &results{ceilings: [2]rateResult{ceiling, ceiling},
			part:        [2]rateResult{{events: 10_000, took: tt.one}, {events: 10_000, took: tt.many}},
			partCeiling: rateResult{events: 10_000, took: 800 * time.Millisecond}}
		opts := options{backlog: 10_000, inflight: 1000, channels: tt.channels}
		rows := r.rows(opts)
		one, many := row(rows, "drain, 1 channel"), row(rows, fmt.Sprintf("drain, %d channels", tt.channels))
		if tt.channels < 2 {
			if one != nil || many != nil {
				t.Errorf("-channels %d: partitioned rows %v %v", tt.channels, one, many)
			}
			if strings.Contains(r.notes(opts), "partition") {
				t.Errorf("-channels %d: notes mention the partitioned drain", tt.channels)
			}
			continue
		}
		if one == nil || many == nil {
			t.Fatalf("-channels %d: rows %v", tt.channels, rows)
		}
		if want := fmt.Sprintf("drain, 1 channel → %d queues", tt.channels); !strings.HasPrefix(one[0], want) {
			t.Errorf("row %q, want %q", one[0], want)
		}
		if want := ratio(r.part[0].rate(), ceiling.rate()); one[3] != want || one[5] != "" {
			t.Errorf("1-channel row %v: want ratio %s to the ceiling, no target", one, want)
		}
		if many[3] != tt.ratio || many[4] != "≥ 1.30" || many[5] != tt.ok {
			t.Errorf("%d-channel row %v: want ratio %s, ok %s", tt.channels, many, tt.ratio, tt.ok)
		}
		if missed := missedTargets(rows); slices.Contains(missed, many[0]) != (tt.ok == "NO") {
			t.Errorf("missed targets %v", missed)
		}
		if c := row(rows, fmt.Sprintf("broker ceiling, %d publishers", tt.channels)); c == nil || c[3] != "1.25" || c[5] != "" {
			t.Errorf("%d-publisher ceiling row %v: want ratio 1.25 to the 1-channel ceiling, no target", tt.channels, c)
		}
		notes := r.notes(opts)
		if !strings.Contains(notes, "relay partitioned drain, 1 channel") ||
			!strings.Contains(notes, fmt.Sprintf("relay partitioned drain, %d channels", tt.channels)) {
			t.Errorf("notes lack the partitioned CPU windows:\n%s", notes)
		}
	}
	// No 1-channel drain measured: no division by zero, and not "yes".
	r := &results{ceilings: [2]rateResult{ceiling, ceiling}}
	many := row(r.rows(options{backlog: 10_000, channels: 4}), "drain, 4 channels")
	if many[3] != "n/a" || many[5] != "NO" {
		t.Errorf("unmeasured: %v", many)
	}
}

func TestIdleRetentionApart(t *testing.T) {
	for q, want := range map[string]bool{
		"WITH batch AS MATERIALIZED (SELECT ctid) , gone AS ( DELETE FROM \"public\".\"event_outbox\" WHERE ctid = ANY($1))":                   true,
		"SELECT EXISTS (SELECT $1 FROM pg_index i WHERE i.indpred IS NULL)":                                                                    true,
		"SELECT coalesce(max(pg_relation_size(c.oid)), $1) FROM pg_class c WHERE c.oid IN (SELECT relid FROM pg_partition_tree($2::regclass))": true,
		"SELECT pg_try_advisory_lock($1, hashtext($2))":                                                                                        false,
		"SELECT count(*) FILTER (WHERE last_error IS NULL) FROM event_outbox":                                                                  false,
	} {
		if got := isRetention(q); got != want {
			t.Errorf("isRetention(%q) = %v, want %v", q, got, want)
		}
	}
	i := idleResult{calls: 4, retention: 3, window: 15 * time.Second}
	if i.polling() != 1 || i.polling() > i.allowed() {
		t.Errorf("polling %d of allowed %d, want 1 within", i.polling(), i.allowed())
	}
	if got, want := idleText(i), "0.267 /s (4 in 15s, 3 of them retention's run)"; got != want {
		t.Errorf("idleText = %q, want %q", got, want)
	}
	if got, want := idleText(idleResult{calls: 1, window: 15 * time.Second}), "0.067 /s (1 in 15s)"; got != want {
		t.Errorf("idleText = %q, want %q", got, want)
	}
}
