package main

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
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

var (
	mdLinkRE  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*$`)
	slugDrop  = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// markdownLines returns the lines of a Markdown file outside code fences:
// a heading or a link inside a fence is not one.
func markdownLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fenced := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			out = append(out, "")
			continue
		}
		if fenced {
			line = ""
		}
		out = append(out, line)
	}
	return out
}

// anchors returns the fragment of every heading of a Markdown file, as
// GitHub makes them: lower case, punctuation dropped, spaces as hyphens, a
// repeated one suffixed -1, -2, ….
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range markdownLines(t, path) {
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		slug := strings.ReplaceAll(slugDrop.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// TestDocLinks: every relative link of the README, the docs and the chart's
// README leads to a file of the repository and, with a #fragment into a
// Markdown file, to one of its headings; a page that moves or a heading
// that is renamed cannot leave a dead link behind.
func TestDocLinks(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(repoRoot, "README.md"), filepath.Join(repoRoot, "deploy", "helm", "README.md"))
	links := 0
	for _, f := range files {
		for i, line := range markdownLines(t, f) {
			for _, m := range mdLinkRE.FindAllStringSubmatch(line, -1) {
				target, frag, _ := strings.Cut(m[1], "#")
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				path := f
				if target != "" {
					path = filepath.Join(filepath.Dir(f), target)
				}
				rel, err := filepath.Rel(repoRoot, path)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s:%d: link %s: no such file %s", f, i+1, m[1], rel)
					continue
				}
				if frag != "" && strings.HasSuffix(path, ".md") && !anchors(t, path)[frag] {
					t.Errorf("%s:%d: link %s: %s has no heading with the anchor #%s", f, i+1, m[1], rel, frag)
				}
			}
		}
	}
	if links < 50 {
		t.Fatalf("only %d relative links found in %d files: is the repository layout what the test expects?", links, len(files))
	}
}

// layoutTable reads the "| package | holds |" table of docs/architecture.md:
// the path in the first cell of each row, and its line.
func layoutTable(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	in := false
	for i, line := range markdownLines(t, filepath.Join(repoRoot, "docs", "architecture.md")) {
		switch {
		case strings.HasPrefix(line, "| package |"):
			in = true
		case !strings.HasPrefix(line, "|"):
			in = false
		case in && !strings.HasPrefix(line, "|---"):
			first := strings.Split(strings.Trim(line, "|"), "|")[0]
			if m := codeSpanRE.FindStringSubmatch(first); m != nil {
				out[m[1]] = i + 1
			}
		}
	}
	return out
}

// TestArchitectureLayout: the layout table of docs/architecture.md covers
// every directory of the tree that holds Go files (itself or through a
// listed parent, as deploy/helm covers the chart's test module), and every
// path it lists exists.
func TestArchitectureLayout(t *testing.T) {
	table := layoutTable(t)
	if len(table) < 15 {
		t.Fatalf("only %d rows in the layout table of docs/architecture.md: is the page what the test expects?", len(table))
	}
	covered := func(dir string) bool {
		for d := dir; d != "."; d = filepath.Dir(d) {
			if _, ok := table[filepath.ToSlash(d)]; ok {
				return true
			}
		}
		return false
	}
	dirs := map[string]bool{}
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".bin", "bin", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") {
			rel, err := filepath.Rel(repoRoot, filepath.Dir(path))
			if err != nil {
				return err
			}
			dirs[rel] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir := range dirs {
		if !covered(dir) {
			t.Errorf("%s holds Go files but the layout table of docs/architecture.md has no row for it", dir)
		}
	}
	for p, line := range table {
		if _, err := os.Stat(filepath.Join(repoRoot, p)); err != nil {
			t.Errorf("docs/architecture.md:%d: the layout table lists %s, which does not exist", line, p)
		}
	}
}
