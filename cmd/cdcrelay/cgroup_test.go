package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

var builds testenv.Builds

func TestMain(m *testing.M) { builds.Main(m) }

// TestIntegrationMemoryLimitInRealCgroup runs the built relay inside a real memory
// cgroup with a 256MiB limit and checks that it gives the Go runtime 90%
// of it. It uses whichever hierarchy carries the memory controller on this
// machine: cgroup v2 (memory.max) or v1 (memory.limit_in_bytes). It needs
// root and a writable cgroup mount; without them it fails rather than
// pretend. The same process shows the start-up warning about an unknown
// variable and serves cdcrelay_build_info.
func TestIntegrationMemoryLimitInRealCgroup(t *testing.T) {
	dir, limitFile := newMemoryCgroup(t)
	const limit = 256 << 20
	if err := os.WriteFile(filepath.Join(dir, limitFile), []byte(fmt.Sprint(limit)), 0o644); err != nil {
		t.Fatalf("set %s: %v", limitFile, err)
	}
	bin := builds.Relay(t, false, "")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CDCRELAY_") && !strings.HasPrefix(kv, "GOMEMLIMIT=") {
			env = append(env, kv)
		}
	}
	// Nothing listens on port 1: the relay logs its start and keeps
	// retrying, which is all this test needs.
	env = append(env, "CDCRELAY_DATABASE_URL=postgres://relay@127.0.0.1:1/app", "CDCRELAY_AMQP_URL=amqp://guest:guest@127.0.0.1:1/",
		"CDCRELAY_HTTP_ADDR=127.0.0.1:0", "CDCRELAY_POISSON=stop")
	// The shell joins the cgroup before exec, so the relay starts in it.
	p := testenv.StartProcess(t, "/bin/sh", env, "-c", `echo $$ > "$0/cgroup.procs" && exec "$1" run`, dir, bin)
	want := fmt.Sprintf("memory_limit_bytes=%d container_limit_bytes=%d", softLimit(limit), limit)
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(p.Log.String(), want) {
		if exited, err := p.Exited(); exited || time.Now().After(deadline) {
			t.Fatalf("no %q in the relay's log (exited %v: %v):\n%s", want, exited, err, p.Log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(p.Log.String(), "CDCRELAY_POISSON (did you mean CDCRELAY_POISON?)") {
		t.Errorf("no warning about CDCRELAY_POISSON in:\n%s", p.Log.String())
	}
	// The same process serves cdcrelay_build_info on its real registry.
	addr := regexp.MustCompile(`http=(127\.0\.0\.1:\d+)`)
	for addr.FindStringSubmatch(p.Log.String()) == nil {
		if exited, err := p.Exited(); exited || time.Now().After(deadline) {
			t.Fatalf("no listening address in the relay's log (exited %v: %v):\n%s", exited, err, p.Log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := http.Get("http://" + addr.FindStringSubmatch(p.Log.String())[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	want = fmt.Sprintf(`cdcrelay_build_info{goversion=%q,version="dev"} 1`, runtime.Version())
	if !strings.Contains(string(body), want) {
		t.Errorf("/metrics lacks %s", want)
	}
}

// newMemoryCgroup creates a child of this process's memory cgroup and
// returns its directory and the name of its limit file; the cgroup is
// removed when the test ends (its process killed first by StartProcess's
// cleanup, which runs earlier).
func newMemoryCgroup(t *testing.T) (dir, limitFile string) {
	self, err := os.ReadFile(systemCgroup.self)
	if err != nil {
		t.Fatal(err)
	}
	v2, v1 := parseSelfCgroup(string(self))
	var parent string
	switch {
	case v1 != "":
		parent, limitFile = filepath.Join(systemCgroup.v1Memory, v1), "memory.limit_in_bytes"
	case v2 != "":
		parent, limitFile = filepath.Join(systemCgroup.v2Root, v2), "memory.max"
		ctl, err := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
		if err != nil || !strings.Contains(string(ctl), "memory") {
			t.Fatalf("cgroup v2 %s does not delegate the memory controller to children (cgroup.subtree_control %q, %v)", parent, ctl, err)
		}
	default:
		t.Fatalf("no memory cgroup in %s:\n%s", systemCgroup.self, self)
	}
	dir = filepath.Join(parent, fmt.Sprintf("cdcrelay-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("create a memory cgroup (needs root and a writable cgroup mount): %v", err)
	}
	t.Cleanup(func() {
		for range 50 { // the killed process leaves the cgroup asynchronously
			if err := os.Remove(dir); err == nil || os.IsNotExist(err) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("could not remove cgroup %s", dir)
	})
	return dir, limitFile
}
