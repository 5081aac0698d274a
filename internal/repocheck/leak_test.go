package repocheck

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// leakList is docs/testing.md's list of the packages that call leak.Main.
var leakList = regexp.MustCompile(`(?s)The packages whose code starts goroutines without services in the way \(([^)]*)\)`)

// TestTestingDocListsLeakChecks: the packages docs/testing.md says call
// leak.Main are exactly those whose TestMain does, so adding the check to
// a package (or dropping it) shows in the page.
func TestTestingDocListsLeakChecks(t *testing.T) {
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "testing.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := leakList.FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/testing.md no longer lists the packages that call leak.Main")
	}
	listed := spans(string(m[1]))
	var calling []string
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "main_test.go" {
			return err
		}
		src, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(src), "leak.Main(") {
			calling = append(calling, filepath.Base(filepath.Dir(p)))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(listed)
	slices.Sort(calling)
	if !slices.Equal(listed, calling) {
		t.Errorf("docs/testing.md lists %v as calling leak.Main; the packages that do are %v", listed, calling)
	}
}
