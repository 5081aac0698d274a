package repocheck

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCmdHoldsOnlyShippedBinaries fails on a directory under cmd/ that is
// neither the relay nor a demo.
func TestCmdHoldsOnlyShippedBinaries(t *testing.T) {
	// The relay, the one binary the image ships, and the two demos the
	// README's make demo and make demo-inbox run for a user. A build helper
	// (tools/image) or a measurement tool (tools/bench) belongs under
	// tools/, so that cmd/ reads as what reaches users.
	shipped := []string{"cdcrelay", "cdcrelay-demo", "cdcrelay-inbox-demo"}
	entries, err := os.ReadDir(filepath.Join("..", "..", "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, e := range entries {
		if !e.IsDir() {
			t.Errorf("cmd/%s: cmd/ holds one directory per shipped binary, nothing else", e.Name())
			continue
		}
		found = append(found, e.Name())
		if !slices.Contains(shipped, e.Name()) {
			t.Errorf("cmd/%s is neither the relay nor a demo: a tool belongs under tools/ "+
				"(or, if it ships, add it to this test's list with the reason)", e.Name())
		}
	}
	if !slices.Contains(found, "cdcrelay") {
		t.Fatalf("cmd/cdcrelay not found among %v: the walk is broken", found)
	}
}

// TestBinariesDoNotLinkTesting fails if a program under cmd/ or tools/
// links the testing package, which internal/testenv and any other package
// of testing.TB helpers import: the binaries start their services through
// internal/svckit, which does not (docs/testing.md, on repocheck). go list -deps is the
// linker's view, build tags aside, so a helper file added to the kit that
// imports testing fails here too.
func TestBinariesDoNotLinkTesting(t *testing.T) {
	deps := listDeps(t, "./cmd/...", "./tools/...")
	for _, want := range []string{"cmd/cdcrelay", "cmd/cdcrelay-demo", "cmd/cdcrelay-inbox-demo", "tools/bench", "tools/image"} {
		if _, ok := deps[want]; !ok {
			t.Errorf("go list found no %s: the listing is broken, or the program moved", want)
		}
	}
	for pkg, d := range deps {
		if slices.Contains(d, "testing") {
			t.Errorf("%s links the testing package (through %s): start services with internal/svckit, not internal/testenv",
				pkg, testingVia(d))
		}
	}
	// The check can fail: the test kit itself links testing.
	if kit := listDeps(t, "./internal/testenv"); !slices.Contains(kit["internal/testenv"], "testing") {
		t.Fatalf("internal/testenv does not link testing by go list's account: the check above proves nothing")
	}
}

// listDeps runs go list -deps over patterns from the repository root and
// returns each listed package (its path inside the module) with its
// dependencies.
func listDeps(t *testing.T, patterns ...string) map[string][]string {
	t.Helper()
	const module = "github.com/cdcrelay/cdcrelay/"
	args := append([]string{"list", "-f", `{{.ImportPath}} {{join .Deps " "}}`}, patterns...)
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list %v: %v\n%s", patterns, err, ee.Stderr)
		}
		t.Fatalf("go list %v: %v", patterns, err)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		deps[strings.TrimPrefix(f[0], module)] = f[1:]
	}
	return deps
}

// testingVia names the module's packages among deps that usually bring in
// testing, to point at the import to remove.
func testingVia(deps []string) string {
	var via []string
	for _, d := range deps {
		if strings.HasSuffix(d, "/internal/testenv") || strings.Contains(d, "/internal/testenv/") {
			via = append(via, d)
		}
	}
	if len(via) == 0 {
		return "a dependency; go list -deps shows which"
	}
	return strings.Join(via, ", ")
}
