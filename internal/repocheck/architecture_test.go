package repocheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// enforcedBy is an invariant's "Enforced by … Tests:" sentence.
	enforcedBy = regexp.MustCompile(`(?s)Enforced by\s+(.*?)Tests:`)
	// span is a backticked span of a paragraph.
	span = regexp.MustCompile("`([^`]+)`")
	// blockStart is a line that starts a paragraph of its own: a list
	// item, a table row, a heading.
	blockStart = regexp.MustCompile(`^\s*(?:\d+\.|-|\||#)`)
)

// paragraphs splits a Markdown page into paragraphs (a list item, a table
// row, a heading, or lines between blank ones), each joined into one line,
// leaving out fenced code blocks.
func paragraphs(doc string) []string {
	var out []string
	var cur []string
	flush := func() {
		if len(cur) > 0 {
			out = append(out, strings.Join(cur, " "))
			cur = nil
		}
	}
	fenced := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			flush()
			continue
		}
		if fenced {
			continue
		}
		if strings.TrimSpace(line) == "" || blockStart.MatchString(line) {
			flush()
		}
		if strings.TrimSpace(line) != "" {
			cur = append(cur, strings.TrimSpace(line))
		}
	}
	flush()
	return out
}

// fencedNames are the names a fenced block (the flow diagram) cites
// without backticks: pkg.Name and pkg.Type.Member of a package of the
// repository, and CDCRELAY_* variables.
func (tr *tree) fencedNames(doc string) []string {
	var out []string
	for i, block := range strings.Split(doc, "```") {
		if i%2 == 0 {
			continue // outside a fence
		}
		for _, w := range fencedWord.FindAllString(block, -1) {
			first, _, dotted := strings.Cut(w, ".")
			if (dotted && len(tr.byName[first]) > 0) || strings.HasPrefix(w, "CDCRELAY_") {
				out = append(out, strings.TrimSuffix(w, "."))
			}
		}
	}
	return out
}

// fencedWord is a word of a fenced block, dots included.
var fencedWord = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*`)

// spans are a paragraph's backticked spans, inner whitespace collapsed (a
// span may wrap across lines).
func spans(par string) []string {
	var out []string
	for _, m := range span.FindAllStringSubmatch(par, -1) {
		out = append(out, strings.Join(strings.Fields(m[1]), " "))
	}
	return out
}

// TestArchitectureCitesRealCode: every backticked span of
// docs/architecture.md resolves exactly by the rule of resolve (a Go name
// in the packages its paragraph names, a file, a test, a variable, a
// metric, a make target, a word of the code's strings), so a rename, a
// move or a name that never existed cannot leave the map of the code
// stale. Each invariant names the code that enforces it.
func TestArchitectureCitesRealCode(t *testing.T) {
	root := filepath.Join("..", "..")
	raw, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	tr := loadTree(t, root)
	checked := 0
	for _, par := range paragraphs(string(raw)) {
		ss := spans(par)
		ctx := tr.contextOf(ss)
		for _, s := range ss {
			checked++
			if why := tr.resolve(s, ctx); why != "" {
				t.Errorf("docs/architecture.md `%s`: %s\n\tin: %.120s…", s, why, par)
			}
		}
	}
	for _, name := range tr.fencedNames(string(raw)) {
		checked++
		if why := tr.resolve(name, nil); why != "" {
			t.Errorf("docs/architecture.md's diagram names %s: %s", name, why)
		}
	}
	if checked < 300 {
		t.Fatalf("only %d spans checked; the page names more", checked)
	}
	sentences := enforcedBy.FindAllStringSubmatch(string(raw), -1)
	if len(sentences) < 12 {
		t.Fatalf("%d invariants say what enforces them, want all 12", len(sentences))
	}
	for _, s := range sentences {
		if !hasGoName(spans(s[1])) {
			t.Errorf("an invariant is enforced by no named function, method or type: %.100s", s[1])
		}
	}
}

func hasGoName(ss []string) bool {
	for _, s := range ss {
		if goName.MatchString(s) && !testName.MatchString(s) {
			return true
		}
	}
	return false
}

// citedTest is a test, fuzz target or benchmark docs/architecture.md names.
var citedTest = regexp.MustCompile("`((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]+)`")

// TestArchitectureNamesRealTests: docs/architecture.md names the tests of
// its invariants and of the table of what the relay remembers (each one
// is resolved by TestArchitectureCitesRealCode), so the table of what
// proves a belief is dropped cannot quietly lose them.
func TestArchitectureNamesRealTests(t *testing.T) {
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	tr := loadTree(t, root)
	cited := citedTest.FindAllStringSubmatch(string(doc), -1)
	if len(cited) < 50 {
		t.Fatalf("docs/architecture.md names %d tests; the invariants and the table of what the relay remembers name more", len(cited))
	}
	for _, m := range cited {
		if !tr.tests[m[1]] {
			t.Errorf("docs/architecture.md names %s, but no test file declares func %s", m[1], m[1])
		}
	}
}
