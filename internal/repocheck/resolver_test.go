package repocheck

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// fixture is a tiny repository for the resolver's own tests: two types
// with a method of the same name, a top-level func of that name too, and
// one of each kind of name the page cites.
func fixture() map[string]string {
	return map[string]string{
		"internal/slot/watermark.go":      "package slot\n\ntype Watermark struct{ next uint64 }\n\nfunc (w *Watermark) release() {}\n",
		"internal/slot/watermark_test.go": "package slot\n\nimport \"testing\"\n\nfunc TestWatermarkAcks(t *testing.T) {}\n",
		"internal/janitor/write.go": "package janitor\n\ntype Janitor struct{}\n\nfunc (j *Janitor) release() {}\n\n" +
			"func (j *Janitor) settleMarked() {}\n\nconst policy = \"park\"\n",
		"internal/relay/dbshutdown.go": "package relay\n\nimport \"os/signal\"\n\nfunc release() {}\n\n" +
			"func watchDatabaseShutdown() { _, _ = signal.NotifyContext(nil) }\n",
		"internal/config/config.go":  "package config\n\ntype Config struct {\n\tSlot string `env:\"SLOT, default=x\"`\n}\n",
		"internal/failpoint/on.go":   "//go:build failpoints\n\npackage failpoint\n",
		"docs/metrics.txt":           "cdcrelay_role gauge 1 for the role\n",
		"Makefile":                   "test-pg-matrix:\n\tgo test ./...\n",
		"migrations/0001_outbox.sql": "CREATE TABLE event_outbox (published_at timestamptz);\n",
	}
}

func fixtureTree(t *testing.T) *tree {
	t.Helper()
	root := t.TempDir()
	for name, src := range fixture() {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return loadTree(t, root)
}

// TestResolve: the names that must resolve do, and the names that must
// not (another type's method, a name declared nowhere, one declared
// twice outside the paragraph's packages, a file that is not there)
// do not.
func TestResolve(t *testing.T) {
	tr := fixtureTree(t)
	slot := []string{"internal/slot"}
	for _, c := range []struct {
		span string
		ctx  []string
		ok   bool
	}{
		{"slot.Watermark.release", nil, true},
		{"Watermark.release", slot, true},
		{"Watermark.release", []string{"internal/relay"}, true}, // no Watermark there: the tree's only one
		{"Janitor.release", nil, true},
		{"janitor.Janitor.settleMarked", nil, true},
		{"settleMarked", nil, true},
		{"release", slot, true}, // the paragraph's package decides
		{"relay.watchDatabaseShutdown", nil, true},
		{"signal.NotifyContext", nil, true},
		{"internal/slot/watermark.go", nil, true},
		{"slot/watermark.go", nil, true},
		{"watermark.go", slot, true},
		{"internal/janitor", nil, true},
		{"CDCRELAY_SLOT", nil, true},
		{"CDCRELAY_SLOT=other", nil, true},
		{"cdcrelay_role", nil, true},
		{"cdcrelay_*", nil, true},
		{"TestWatermarkAcks", nil, true},
		{"TestWatermark*", nil, true},
		{"make test-pg-matrix", nil, true},
		{"park", nil, true},
		{"published_at IS NULL", nil, true},
		{"failpoints", nil, true},
		{"janitor", nil, true},

		{"Watermark.settleMarked", nil, false}, // the janitor's, not the watermark's
		{"Watermark.settleMarked", slot, false},
		{"slot.Watermark.settleMarked", nil, false},
		{"Watermark.nope", slot, false},
		{"Nope.release", nil, false},
		{"watchStopping", nil, false},
		{"relay.watchStopping", nil, false},
		{"release", nil, false}, // three packages declare it: ambiguous
		{"slot.Nope", nil, false},
		{"signal.Nope", nil, false},
		{"nope.Watermark", nil, false},
		{"internal/slot/nope.go", nil, false},
		{"relay/stream.go", nil, false},
		{"watermark.go", nil, false},
		{"CDCRELAY_NOPE", nil, false},
		{"cdcrelay_nope_total", nil, false},
		{"TestNope", nil, false},
		{"TestNope*", nil, false},
		{"make nope", nil, false},
		{"wal_status = lost", nil, false},
		{"cdcrelay-commit-lsn", nil, false},
	} {
		why := tr.resolve(c.span, c.ctx)
		if (why == "") != c.ok {
			t.Errorf("resolve(%q, %v) = %q; want resolved %v", c.span, c.ctx, why, c.ok)
		}
	}
}

// TestParagraphs: a list item, a table row and a heading are paragraphs
// of their own, a span wrapped across lines is one span, and a fenced
// block is not read.
func TestParagraphs(t *testing.T) {
	doc := "# Title\n\nOne `a.b`\nand `make\n  test`.\n1. item `c`\n   goes on `d`\n| row `e` |\n```\n`f`\n```\n"
	var got [][]string
	for _, p := range paragraphs(doc) {
		got = append(got, spans(p))
	}
	want := [][]string{nil, {"a.b", "make test"}, {"c", "d"}, {"e"}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("spans by paragraph %q, want %q", got, want)
	}
}

// TestContextOf: a paragraph's packages come from its files, its
// directories, its pkg. prefixes and its types.
func TestContextOf(t *testing.T) {
	tr := fixtureTree(t)
	got := tr.contextOf([]string{"relay/dbshutdown.go", "internal/janitor", "slot.Watermark", "Janitor.release", "x"})
	want := []string{"internal/relay", "internal/janitor", "internal/slot"}
	if !slices.Equal(got, want) {
		t.Errorf("contextOf = %v, want %v", got, want)
	}
}

// TestFencedNames: a fenced block's names of the repository's packages and
// its variables are read; its other words and what lies outside it are
// not.
func TestFencedNames(t *testing.T) {
	tr := fixtureTree(t)
	doc := "slot.Outside\n```\n slot.Watermark.release ── janitor.Run, by CDCRELAY_SLOT\n fmt.Println a.b\n```\n"
	got := tr.fencedNames(doc)
	want := []string{"slot.Watermark.release", "janitor.Run", "CDCRELAY_SLOT"}
	if !slices.Equal(got, want) {
		t.Errorf("fencedNames = %q, want %q", got, want)
	}
	if why := tr.resolve("janitor.Run", nil); why == "" {
		t.Error("janitor.Run resolved, but the fixture's janitor declares no top-level Run")
	}
}
