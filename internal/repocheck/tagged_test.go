package repocheck

import (
	"go/build/constraint"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestTaggedTestsRun holds every test in a file that only a build tag
// compiles to the Makefile list that runs it: go test -run with a list
// skips, without a word, a test the list misses, so a test moved into the
// fault suite or the version matrix and not listed would never run
// (docs/testing.md).
func TestTaggedTestsRun(t *testing.T) {
	vars := makeVars(t, filepath.Join("..", "..", "Makefile"))
	lists := map[string][]string{
		"faults":   {"RELAY_FAULT_TESTS"},
		"pgmatrix": {"PGMATRIX_TESTS", "PGMATRIX_TESTS_16", "PGMATRIX_TESTS_17"},
	}
	checked := 0
	// internal/faults runs whole under its tags; these packages run by list.
	for _, dir := range []string{"internal/relay", "internal/monitor", "internal/testenv"} {
		files, err := filepath.Glob(filepath.Join("..", "..", dir, "*_test.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			tag, tests := taggedTests(t, f)
			if tag == "" {
				continue
			}
			names, ok := lists[tag]
			if !ok {
				t.Errorf("%s: build tag %q, which no Makefile list runs", f, tag)
				continue
			}
			for _, test := range tests {
				checked++
				if !matchesAny(t, vars, names, test) {
					t.Errorf("%s: %s (tag %s) is in none of the Makefile's %s: no target runs it", f, test, tag, strings.Join(names, ", "))
				}
			}
		}
	}
	if checked < 10 {
		t.Fatalf("only %d tagged tests found: the walk is broken", checked)
	}
}

// taggedTests returns the one build tag a file's constraint names (empty
// for a file without one) and the file's test functions.
func taggedTests(t *testing.T, path string) (string, []string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	if !constraint.IsGoBuild(first) {
		return "", nil
	}
	expr, err := constraint.Parse(first)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	tag, ok := expr.(*constraint.TagExpr)
	if !ok {
		t.Fatalf("%s: constraint %q is not one tag; teach this test which list runs it", path, first)
	}
	var tests []string
	for _, m := range regexp.MustCompile(`(?m)^func (Test\w+)\(t \*testing\.T\)`).FindAllStringSubmatch(string(b), -1) {
		tests = append(tests, m[1])
	}
	return tag.Tag, tests
}

// makeVars reads the Makefile's simple "NAME = value" and "NAME ?= value"
// lines, with make's $$ turned back into $.
func makeVars(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Z0-9_]+)\s*\??=\s*(.*)$`).FindAllStringSubmatch(string(b), -1) {
		vars[m[1]] = strings.ReplaceAll(m[2], "$$", "$")
	}
	return vars
}

func matchesAny(t *testing.T, vars map[string]string, names []string, test string) bool {
	t.Helper()
	for _, name := range names {
		v, ok := vars[name]
		if !ok {
			t.Fatalf("Makefile: no %s", name)
		}
		re, err := regexp.Compile(v)
		if err != nil {
			t.Fatalf("Makefile: %s: %v", name, err)
		}
		if re.MatchString(test) {
			return true
		}
	}
	return false
}
