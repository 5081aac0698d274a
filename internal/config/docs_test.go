package config_test

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// docs/configuration.md is the reference of every variable the relay reads.
// These tests hold it to Config's env tags, so that a variable added, removed
// or given another default cannot leave the page behind.

var repoRoot = filepath.Join("..", "..")

var varRE = regexp.MustCompile(`CDCRELAY_[A-Z0-9_]+`)

// docRow is one variable of a table in docs/configuration.md.
type docRow struct {
	name, def string
	line      int
}

// variableTables reads every table of a Markdown file whose header has a
// "variable" and a "default" column: one row per variable named in the
// variable cell (a cell may name several).
func variableTables(t *testing.T, path string) []docRow {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rows []docRow
	varCol, defCol := -1, -1
	for i, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "|") {
			varCol, defCol = -1, -1 // a table ends at its first non-row line
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		if varCol < 0 {
			varCol, defCol = slices.Index(cells, "variable"), slices.Index(cells, "default")
			continue
		}
		if defCol < 0 || strings.HasPrefix(cells[0], "---") || len(cells) <= max(varCol, defCol) {
			continue
		}
		for _, name := range varRE.FindAllString(cells[varCol], -1) {
			rows = append(rows, docRow{name: name, def: cells[defCol], line: i + 1})
		}
	}
	return rows
}

// tagDefaults returns each variable's default from Config's env tags
// (`env:"NAME, default=X"`), "" for a variable without one.
func tagDefaults() map[string]string {
	out := map[string]string{}
	t := reflect.TypeFor[config.Config]()
	for i := range t.NumField() {
		tag, ok := t.Field(i).Tag.Lookup("env")
		if !ok {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		def := ""
		if _, d, ok := strings.Cut(opts, "default="); ok {
			def = d
		}
		out[config.Prefix+strings.TrimSpace(name)] = def
	}
	return out
}

// TestConfigurationDoc: docs/configuration.md names every variable the relay
// reads, once, with its default, and no variable it does not read.
func TestConfigurationDoc(t *testing.T) {
	rows := variableTables(t, filepath.Join(repoRoot, "docs", "configuration.md"))
	defaults := tagDefaults()
	known := config.Known()
	if len(known) < 30 || len(defaults) != len(known) {
		t.Fatalf("config.Known() has %d names, the env tags %d: %v", len(known), len(defaults), known)
	}
	seen := map[string]int{}
	for _, r := range rows {
		if prev, dup := seen[r.name]; dup {
			t.Errorf("docs/configuration.md:%d: %s is listed again (first on line %d)", r.line, r.name, prev)
			continue
		}
		seen[r.name] = r.line
		want, ok := defaults[r.name]
		switch {
		case !ok:
			t.Errorf("docs/configuration.md:%d: %s is documented but the relay does not read it (no env tag in config.Config)", r.line, r.name)
		case want != "" && r.def != "`"+want+"`":
			t.Errorf("docs/configuration.md:%d: %s: the default column says %s, the env tag says `%s`", r.line, r.name, r.def, want)
		case want == "" && (r.def == "" || strings.HasPrefix(r.def, "`")):
			t.Errorf("docs/configuration.md:%d: %s has no default in its env tag; the default column should say so in words (required, none, …), not %q", r.line, r.name, r.def)
		}
	}
	for _, name := range known {
		if _, ok := seen[name]; !ok {
			t.Errorf("the relay reads %s (config.Config) but docs/configuration.md has no row for it", name)
		}
	}
}

// TestDocsVariableDefaults: a table elsewhere in the docs that gives
// variables with their defaults (operations.md's retention table) gives the
// defaults of Config's env tags too.
func TestDocsVariableDefaults(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	defaults := tagDefaults()
	rows := 0
	for _, f := range append(files, filepath.Join(repoRoot, "README.md")) {
		switch filepath.Base(f) {
		case "configuration.md":
			continue // TestConfigurationDoc
		case "testing.md":
			continue // the test environment's variables, not the relay's (notRead)
		}
		for _, r := range variableTables(t, f) {
			rows++
			want, ok := defaults[r.name]
			switch {
			case !ok:
				t.Errorf("%s:%d: %s is not a variable the relay reads", f, r.line, r.name)
			case want != "" && r.def != "`"+want+"`":
				t.Errorf("%s:%d: %s: the default column says %s, the env tag says `%s`", f, r.line, r.name, r.def, want)
			}
		}
	}
	if rows == 0 {
		t.Fatal("no variable table with a default column outside docs/configuration.md: drop this test or fix its reader")
	}
}

// notRead are CDCRELAY_ names the docs may mention although Config has no
// field for them: the failpoint variable of test builds, the variables of
// the test environment (internal/testenv), the fault matrix's report file
// and the chart tests' helm folder, and the misspelling the docs use as an
// example of a typo.
var notRead = []string{
	"CDCRELAY_FAILPOINT",
	"CDCRELAY_PG_BIN", "CDCRELAY_RABBITMQ_BIN", "CDCRELAY_RABBITMQ_CONFIG", "CDCRELAY_RABBITMQ4_CACHE", "CDCRELAY_TEST_AMQP_URL", "CDCRELAY_FAULTS_REPORT",
	"CDCRELAY_HELM_CACHE",
	"CDCRELAY_POISSON",
}

// TestDocsNameOnlyKnownVariables: every CDCRELAY_ name in the README, the
// docs and the chart's README is one the relay reads (or one of notRead), so
// a renamed or removed variable leaves no stale mention behind.
func TestDocsNameOnlyKnownVariables(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(repoRoot, "README.md"), filepath.Join(repoRoot, "deploy", "helm", "README.md"))
	known := append(config.Known(), notRead...)
	mentions := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, name := range varRE.FindAllString(line, -1) {
				mentions++
				if !slices.Contains(known, name) {
					t.Errorf("%s:%d: %s is not a variable the relay reads", f, i+1, name)
				}
			}
		}
	}
	if mentions < 50 {
		t.Fatalf("only %d CDCRELAY_ mentions found in %d files: is the repository layout what the test expects?", mentions, len(files))
	}
}
