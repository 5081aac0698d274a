package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcrelay/cdcrelay/internal/preflight"
)

func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildInfo())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "cdcrelay_build_info" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v", mfs)
	}
	m := mfs[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if m.GetGauge().GetValue() != 1 || labels["version"] != version || !strings.HasPrefix(labels["goversion"], "go") || len(labels) != 2 {
		t.Fatalf("cdcrelay_build_info = %v %v", labels, m.GetGauge().GetValue())
	}
}

func TestWarnUnknown(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	warnUnknown(log, []string{"CDCRELAY_SLOT=a", "CDCRELAY_POISSON=stop", "HOME=/root", "CDCRELAY_SHINY=1"})
	out := buf.String()
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, "level=WARN") ||
		!strings.Contains(out, "CDCRELAY_POISSON (did you mean CDCRELAY_POISON?), CDCRELAY_SHINY") {
		t.Fatalf("want one warning naming both variables, got:\n%s", out)
	}
	buf.Reset()
	warnUnknown(log, []string{"CDCRELAY_SLOT=a", "HOME=/root"})
	if buf.Len() != 0 {
		t.Fatalf("warned with every variable known:\n%s", buf.String())
	}
}

func TestConfigFindings(t *testing.T) {
	fs := configFindings([]string{"CDCRELAY_POISSON=stop"})
	if len(fs) != 1 || fs[0].Severity != preflight.Error || !strings.Contains(fs[0].Message, "CDCRELAY_POISSON (did you mean CDCRELAY_POISON?)") {
		t.Fatalf("findings %+v", fs)
	}
	fs = configFindings([]string{"CDCRELAY_POISON=stop"})
	if len(fs) != 1 || fs[0].Severity != preflight.OK {
		t.Fatalf("findings %+v", fs)
	}
}

func TestParseSelfCgroup(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		v2, v1        string
	}{
		{"v2 only", "0::/kubepods/pod1/abc\n", "/kubepods/pod1/abc", ""},
		{"v2 namespaced", "0::/\n", "/", ""},
		{"hybrid", "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/docker/abc\n", "/docker/abc", "/docker/abc"},
		{"v1 joined controllers", "5:cpuacct,memory:/x\n", "", "/x"},
		{"v1 memsw is not memory", "5:memory_x:/x\n", "", ""},
		{"empty", "", "", ""},
		{"garbage", "nonsense\n1:name=systemd:/\n", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v2, v1 := parseSelfCgroup(tc.content)
			if v2 != tc.v2 || v1 != tc.v1 {
				t.Fatalf("parseSelfCgroup = %q, %q; want %q, %q", v2, v1, tc.v2, tc.v1)
			}
		})
	}
}

func TestParseLimit(t *testing.T) {
	for _, tc := range []struct {
		content string
		limit   int64
		limited bool
		err     bool
	}{
		{"max\n", 0, false, false},
		{"536870912\n", 512 << 20, true, false},
		{"9223372036854771712\n", 0, false, false}, // v1 unlimited
		{"9223372036854775807", 0, false, false},
		{"0", 0, false, true},
		{"-1", 0, false, true},
		{"lots", 0, false, true},
		{"", 0, false, true},
	} {
		limit, limited, err := parseLimit(tc.content)
		if limit != tc.limit || limited != tc.limited || (err != nil) != tc.err {
			t.Errorf("parseLimit(%q) = %d, %v, %v; want %d, %v, error %v", tc.content, limit, limited, err, tc.limit, tc.limited, tc.err)
		}
	}
}

func TestSoftLimit(t *testing.T) {
	for _, tc := range []struct{ limit, want int64 }{
		{512 << 20, 483183810}, {100, 90}, {1 << 62, (1 << 62) / 100 * 90},
	} {
		if got := softLimit(tc.limit); got != tc.want {
			t.Errorf("softLimit(%d) = %d, want %d", tc.limit, got, tc.want)
		}
	}
}

// TestCgroupLimit reads limits from a file tree shaped like the real ones.
func TestCgroupLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		self    string
		files   map[string]string // path under the temporary root -> content
		limit   int64
		file    string
		limited bool
		err     bool
	}{
		{"v2 own limit", "0::/pod/c1\n", map[string]string{"v2/pod/c1/memory.max": "268435456\n", "v2/pod/memory.max": "max\n"},
			256 << 20, "v2/pod/c1/memory.max", true, false},
		{"v2 parent's limit is smaller", "0::/pod/c1\n", map[string]string{"v2/pod/c1/memory.max": "max\n", "v2/pod/memory.max": "134217728\n"},
			128 << 20, "v2/pod/memory.max", true, false},
		{"v2 namespaced: the mount root is the container", "0::/\n", map[string]string{"v2/memory.max": "1073741824\n"},
			1 << 30, "v2/memory.max", true, false},
		{"v2 path not visible: the mount root", "0::/kubepods/x\n", map[string]string{"v2/memory.max": "1073741824\n"},
			1 << 30, "v2/memory.max", true, false},
		{"v2 unlimited", "0::/pod/c1\n", map[string]string{"v2/pod/c1/memory.max": "max\n"}, 0, "", false, false},
		{"v2 no memory controller", "0::/pod/c1\n", map[string]string{"v2/pod/c1/cgroup.procs": ""}, 0, "", false, false},
		{"v2 garbage", "0::/\n", map[string]string{"v2/memory.max": "much\n"}, 0, "", false, true},
		{"v1 limit", "4:memory:/docker/abc\n0::/\n", map[string]string{"v1/docker/abc/memory.limit_in_bytes": "536870912\n", "v1/memory.limit_in_bytes": "9223372036854771712\n"},
			512 << 20, "v1/docker/abc/memory.limit_in_bytes", true, false},
		{"v1 unlimited", "4:memory:/\n", map[string]string{"v1/memory.limit_in_bytes": "9223372036854771712\n"}, 0, "", false, false},
		{"no cgroup file", "", nil, 0, "", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for p, content := range tc.files {
				full := filepath.Join(root, p)
				if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			f := cgroupFiles{self: filepath.Join(root, "self"), v2Root: filepath.Join(root, "v2"), v1Memory: filepath.Join(root, "v1")}
			if tc.self != "" {
				if err := os.WriteFile(f.self, []byte(tc.self), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			limit, file, limited, err := cgroupLimit(f)
			want := ""
			if tc.file != "" {
				want = filepath.Join(root, tc.file)
			}
			if limit != tc.limit || file != want || limited != tc.limited || (err != nil) != tc.err {
				t.Fatalf("cgroupLimit = %d, %q, %v, %v; want %d, %q, %v, error %v", limit, file, limited, err, tc.limit, want, tc.limited, tc.err)
			}
		})
	}
}

// TestSetMemoryLimitRespectsGOMEMLIMIT: with GOMEMLIMIT set, the runtime's
// limit is left alone however small the container's is.
func TestSetMemoryLimitRespectsGOMEMLIMIT(t *testing.T) {
	root := t.TempDir()
	f := cgroupFiles{self: filepath.Join(root, "self"), v2Root: root, v1Memory: filepath.Join(root, "v1")}
	if err := os.WriteFile(f.self, []byte("0::/\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "memory.max"), []byte("104857600\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(before)
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))

	setMemoryLimit(log, func(k string) string { return map[string]string{"GOMEMLIMIT": "1GiB"}[k] }, f)
	if got := debug.SetMemoryLimit(-1); got != before || !strings.Contains(buf.String(), "gomemlimit=1GiB") {
		t.Fatalf("GOMEMLIMIT set: runtime limit %d (was %d), log:\n%s", got, before, buf.String())
	}

	buf.Reset()
	setMemoryLimit(log, func(string) string { return "" }, f)
	if got := debug.SetMemoryLimit(-1); got != 94371840 || !strings.Contains(buf.String(), "memory_limit_bytes=94371840") {
		t.Fatalf("GOMEMLIMIT unset: runtime limit %d, want 90%% of 100MiB; log:\n%s", got, buf.String())
	}
}
