package repocheck

import (
	"regexp"
	"strings"
	"testing"
)

// versionKnowledge is what only internal/pgcaps may hold: a read of
// server_version_num, or a six-digit PostgreSQL version number from 13 on
// (130000, 170010, …). Elsewhere a version test asks pgcaps.Caps for the
// capability it means (docs/architecture.md, the package table).
var versionKnowledge = regexp.MustCompile(`server_version_num|\b(?:1[3-9]|[2-9][0-9])00[0-9]{2}\b`)

// versionsHome is the one package allowed to know version numbers.
const versionsHome = "internal/pgcaps/"

// TestVersionsOnlyInPgcaps fails on a product Go file outside
// internal/pgcaps that reads server_version_num or compares against a
// PostgreSQL version number. Tests and the test kit (internal/testenv)
// may name versions: they pick servers, not behaviour.
func TestVersionsOnlyInPgcaps(t *testing.T) {
	for _, f := range productGoFiles(t, "internal/testenv") {
		if strings.HasPrefix(f.rel, versionsHome) {
			continue
		}
		for i, line := range strings.Split(string(f.body), "\n") {
			if m := versionKnowledge.FindString(line); m != "" {
				t.Errorf("%s:%d: %q: PostgreSQL version knowledge belongs in %s (a pgcaps.Caps capability)", f.rel, i+1, m, versionsHome)
			}
		}
	}
}

// TestVersionKnowledgePattern: the pattern catches what it is for and
// leaves the repository's other large numbers alone.
func TestVersionKnowledgePattern(t *testing.T) {
	for line, want := range map[string]bool{
		"current_setting('server_version_num')::int": true,
		"if v < 160000 {":            true,
		"Version: 170010":            true,
		"const pg19 = 190000":        true,
		"c.MarkBatch > 100000":       false, // PostgreSQL 10, and a batch bound
		"c.RetentionBatch > 1000000": false,
		"SHOW server_version":        false,
		"1700000000":                 false,
	} {
		if got := versionKnowledge.MatchString(line); got != want {
			t.Errorf("%q: matched %v, want %v", line, got, want)
		}
	}
}
