package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// Builds builds cmd/cdcrelay for process tests, once per flavour (race
// detector, build tags) per test binary. A test package keeps one in a
// package variable and calls Main from its TestMain (or Remove from its own).
type Builds struct {
	mu   sync.Mutex
	dir  string
	bins map[string]string
}

// Relay returns the path of the relay built with -race when race is set
// and with the given build tags, building it on first use.
func (b *Builds) Relay(tb testing.TB, race bool, tags string) string {
	tb.Helper()
	RequireIntegration(tb, "the relay binary")
	b.mu.Lock()
	defer b.mu.Unlock()
	key := fmt.Sprintf("race=%v tags=%s", race, tags)
	if bin, ok := b.bins[key]; ok {
		return bin
	}
	if b.dir == "" {
		dir, err := os.MkdirTemp("", "cdcrelay-bin")
		if err != nil {
			tb.Fatal(err)
		}
		b.dir, b.bins = dir, map[string]string{}
	}
	bin := filepath.Join(b.dir, fmt.Sprintf("cdcrelay-%d", len(b.bins)))
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.Command("go", append(args, "./cmd/cdcrelay")...)
	cmd.Dir = moduleRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build: %v\n%s", err, out)
	}
	b.bins[key] = bin
	return bin
}

// Main is a process-test package's TestMain: it runs the tests, deletes
// every binary built, and exits with the tests' code.
func (b *Builds) Main(m *testing.M) {
	code := m.Run()
	b.Remove()
	os.Exit(code)
}

// Remove deletes every binary built.
func (b *Builds) Remove() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
		b.dir, b.bins = "", nil
	}
}

// moduleRoot is the repository root, found from this file's path.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
