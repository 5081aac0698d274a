package testenv

import (
	"fmt"
	"strings"
	"testing"
)

// namedTB is a testing.TB with a chosen name that records Fatalf instead
// of stopping the test.
type namedTB struct {
	testing.TB
	name  string
	fatal string
}

func (n *namedTB) Name() string { return n.name }
func (n *namedTB) Helper()      {}
func (n *namedTB) Fatalf(format string, args ...any) {
	n.fatal = fmt.Sprintf(format, args...)
}

func TestRequireIntegration(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"TestIntegrationAdopt", true},
		{"TestIntegrationAdopt/subtest", true},
		{"BenchmarkIntegrationBackfill", true},
		{"TestAdopt", false},
		{"TestAdopt/TestIntegrationInner", false}, // the top-level name counts
		{"FuzzDecode", false},
		{"BenchmarkDecode", false},
	} {
		tb := &namedTB{TB: t, name: tc.name}
		RequireIntegration(tb, "PostgreSQL")
		if got := tb.fatal == ""; got != tc.ok {
			t.Errorf("%s: allowed %v, want %v (%q)", tc.name, got, tc.ok, tb.fatal)
		}
		if !tc.ok && !strings.Contains(tb.fatal, "must be named TestIntegration") {
			t.Errorf("%s: the failure does not name the fix: %q", tc.name, tb.fatal)
		}
	}
}
