package main

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The metrics table of docs/operations.md is the reference operators read;
// docs/metrics.txt is generated from the registry (TestMetricsList). This
// file holds the first to the second, and the whole tree to references a
// reader of the repository can follow.

var repoRoot = filepath.Join("..", "..")

// metricsTxtNames returns the relay's own metrics (cdcrelay_*) of
// docs/metrics.txt; the Go and process collectors' are documented by their
// libraries, not in the table.
func metricsTxtNames(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(metricsFile)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if name, _, _ := strings.Cut(line, " "); strings.HasPrefix(name, "cdcrelay_") {
			out = append(out, name)
		}
	}
	return out
}

var (
	codeSpanRE = regexp.MustCompile("`([^`]+)`")
	labelsRE   = regexp.MustCompile(`\{[^}]*\}$`)
	metricRE   = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
)

// metricsTableNames reads the table of the "## Metrics" section of
// docs/operations.md: each code span of a row's first cell names a metric,
// without the cdcrelay_ prefix (the section says so) and with its labels in
// braces, which are dropped. It returns full names and the line of each.
func metricsTableNames(t *testing.T) map[string]int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	inSection, header := false, true
	for i, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			inSection = line == "## Metrics"
			continue
		case !inSection || !strings.HasPrefix(line, "|"):
			header = true
			continue
		case header: // the header row, then the |---| row
			if !strings.HasPrefix(line, "|---") {
				continue
			}
			header = false
			continue
		}
		first := strings.Split(strings.Trim(line, "|"), "|")[0]
		for _, m := range codeSpanRE.FindAllStringSubmatch(first, -1) {
			name := labelsRE.ReplaceAllString(m[1], "")
			if !metricRE.MatchString(name) {
				t.Errorf("docs/operations.md:%d: %q in the metrics table is not a metric name", i+1, m[1])
				continue
			}
			if !strings.HasPrefix(name, "cdcrelay_") {
				name = "cdcrelay_" + name
			}
			if prev, dup := out[name]; dup {
				t.Errorf("docs/operations.md:%d: %s is in the metrics table twice (also line %d)", i+1, name, prev)
			}
			out[name] = i + 1
		}
	}
	return out
}

// TestMetricsTable: the metrics table of docs/operations.md ("Metrics")
// names every metric of docs/metrics.txt and no other.
func TestMetricsTable(t *testing.T) {
	registered := metricsTxtNames(t)
	table := metricsTableNames(t)
	if len(registered) < 30 || len(table) < 30 {
		t.Fatalf("%d relay metrics in docs/metrics.txt, %d in the table of docs/operations.md: are the files what the test expects?", len(registered), len(table))
	}
	for _, name := range registered {
		if _, ok := table[name]; !ok {
			t.Errorf("%s is registered (docs/metrics.txt) but missing from the metrics table of docs/operations.md", name)
		}
	}
	for name, line := range table {
		if !slices.Contains(registered, name) {
			t.Errorf("docs/operations.md:%d: the metrics table names %s, which the relay does not register (docs/metrics.txt)", line, name)
		}
	}
}

// outsideRefs are references to places a reader of the repository does not
// have: the working notes beside the repository and the design brief that
// lived there. They are spelt in pieces so that this file does not match.
var outsideRefs = []string{"../" + "shared", "DESIGN" + ".md"}

// trackerRE matches a reference to an issue tracker the repository does not
// carry: the word issue followed by a number.
var trackerRE = regexp.MustCompile(`(?i)\bissue #?[0-9]+\b`)

// TestNoReferenceOutsideTheRepository: no file of the tree cites the working
// notes, the old design brief or an issue number: docs/architecture.md and
// the other pages under docs/ are where the design lives.
func TestNoReferenceOutsideTheRepository(t *testing.T) {
	files := 0
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".bin", "bin": // history, downloaded tools, build output
				return filepath.SkipDir
			}
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.IndexByte(b, 0) >= 0 {
			return nil // binary
		}
		files++
		for i, line := range strings.Split(string(b), "\n") {
			for _, ref := range outsideRefs {
				if strings.Contains(line, ref) {
					t.Errorf("%s:%d: cites %s, which is not in the repository", path, i+1, ref)
				}
			}
			if m := trackerRE.FindString(line); m != "" {
				t.Errorf("%s:%d: cites %q of a tracker the repository does not carry; say what it was about instead", path, i+1, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("only %d files read under %s: is the repository layout what the test expects?", files, repoRoot)
	}
}
