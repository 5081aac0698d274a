package repocheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// citedFile is a source file docs/architecture.md names.
	citedFile = regexp.MustCompile("`((?:internal|cmd)/[A-Za-z0-9_/.-]+\\.go)`")
	// enforcedBy is an invariant's "Enforced by … Tests:" sentence.
	enforcedBy = regexp.MustCompile(`(?s)Enforced by\s+(.*?)Tests:`)
	// codeName is a backticked Go name in it: pkg.Func, pkg.Type.Method,
	// Type.Method or func.
	codeName = regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*(?:\\.[A-Za-z_][A-Za-z0-9_]*)*)`")
)

// TestArchitectureCitesRealCode: every source file docs/architecture.md
// names exists, and every function, method or type an invariant says it is
// enforced by is declared somewhere under internal/, so a rename or a move
// cannot leave the map of the code stale.
func TestArchitectureCitesRealCode(t *testing.T) {
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range citedFile.FindAllStringSubmatch(string(doc), -1) {
		if _, err := os.Stat(filepath.Join(root, m[1])); err != nil {
			t.Errorf("docs/architecture.md cites %s: %v", m[1], err)
		}
	}
	decls := declarations(t, filepath.Join(root, "internal"))
	sentences := enforcedBy.FindAllStringSubmatch(string(doc), -1)
	if len(sentences) < 12 {
		t.Fatalf("%d invariants say what enforces them, want all 12", len(sentences))
	}
	for _, s := range sentences {
		for _, m := range codeName.FindAllStringSubmatch(s[1], -1) {
			parts := strings.Split(m[1], ".")
			name := parts[len(parts)-1]
			if !decls[name] {
				t.Errorf("docs/architecture.md says %s enforces an invariant, but no func, method or type %s is declared under internal/", m[1], name)
			}
		}
	}
}

// declarations returns the names of the funcs, methods and types declared
// in the non-test Go files under dir.
func declarations(t *testing.T, dir string) map[string]bool {
	t.Helper()
	decl := regexp.MustCompile(`(?m)^(?:func (?:\([^)]*\) )?|type )([A-Za-z_][A-Za-z0-9_]*)`)
	return declared(t, dir, decl, func(path string) bool { return !strings.HasSuffix(path, "_test.go") })
}

// declared returns the first group of decl in every Go file under dir that
// want keeps, skipping .git and node_modules.
func declared(t *testing.T, dir string, decl *regexp.Regexp, want func(path string) bool) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || !want(path) {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			names[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// citedTest is a test, fuzz target or benchmark docs/architecture.md names.
var citedTest = regexp.MustCompile("`((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]+)`")

// TestArchitectureNamesRealTests: every test docs/architecture.md names
// (an invariant's tests, a row of "What the relay remembers") is declared
// in a test file of the repository, so the table of what proves a belief
// is dropped cannot point at a test that was renamed or never written.
func TestArchitectureNamesRealTests(t *testing.T) {
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	tests := testDeclarations(t, root)
	cited := citedTest.FindAllStringSubmatch(string(doc), -1)
	if len(cited) < 50 {
		t.Fatalf("docs/architecture.md names %d tests; the invariants and the table of what the relay remembers name more", len(cited))
	}
	for _, m := range cited {
		if !tests[m[1]] {
			t.Errorf("docs/architecture.md names %s, but no test file declares func %s", m[1], m[1])
		}
	}
}

// testDeclarations returns the names of the top-level funcs declared in
// the test files under dir, whatever their build tags.
func testDeclarations(t *testing.T, dir string) map[string]bool {
	t.Helper()
	decl := regexp.MustCompile(`(?m)^func ([A-Za-z_][A-Za-z0-9_]*)\(`)
	return declared(t, dir, decl, func(path string) bool { return strings.HasSuffix(path, "_test.go") })
}
