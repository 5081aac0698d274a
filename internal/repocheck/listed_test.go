package repocheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestListedTestsExist holds every name in the Makefile's test lists to a
// real test: go test -run passes over a name that matches nothing without
// a word, so a renamed test would silently leave, say, make
// test-rabbitmq4 running one test fewer against RabbitMQ 4.x. Each list is
// ^TestIntegration(a|b|c)$; each alternative must match a test function of
// the packages the lists run.
func TestListedTestsExist(t *testing.T) {
	vars := makeVars(t, filepath.Join("..", "..", "Makefile"))
	var tests []string
	for _, dir := range []string{"internal/relay", "internal/faults", "internal/testenv", "internal/monitor", "internal/pgcaps"} {
		files, err := filepath.Glob(filepath.Join("..", "..", dir, "*_test.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range regexp.MustCompile(`(?m)^func (Test\w+)\(t \*testing\.T\)`).FindAllStringSubmatch(string(b), -1) {
				tests = append(tests, m[1])
			}
		}
	}
	if len(tests) < 100 {
		t.Fatalf("only %d tests found: the walk is broken", len(tests))
	}
	list := regexp.MustCompile(`^\^TestIntegration\((.*)\)\$$`)
	for _, name := range []string{"RELAY_FAULT_TESTS", "PGMATRIX_TESTS", "PGMATRIX_TESTS_16", "PGMATRIX_TESTS_17", "RABBITMQ4_RELAY_TESTS", "RABBITMQ4_FAULT_TESTS"} {
		v, ok := vars[name]
		if !ok {
			t.Fatalf("Makefile: no %s", name)
		}
		alts := []string{strings.TrimSuffix(strings.TrimPrefix(v, "^TestIntegration"), "$")} // one pattern
		if m := list.FindStringSubmatch(v); m != nil {
			alts = topAlternatives(m[1])
		} else if !strings.HasPrefix(v, "^TestIntegration") || !strings.HasSuffix(v, "$") {
			t.Fatalf("Makefile: %s = %q is not ^TestIntegration…$; teach this test its shape", name, v)
		}
		for _, alt := range alts {
			re, err := regexp.Compile("^TestIntegration(" + alt + ")$")
			if err != nil {
				t.Fatalf("Makefile: %s: %q: %v", name, alt, err)
			}
			found := false
			for _, test := range tests {
				if re.MatchString(test) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("Makefile: %s names TestIntegration%s, which matches no test: renamed or removed?", name, alt)
			}
		}
	}
}

// topAlternatives splits a regexp at the "|" outside any parentheses:
// BrokerSizeLimit(Parked|Raised) stays one alternative.
func topAlternatives(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case '|':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}
