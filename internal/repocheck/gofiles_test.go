package repocheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// goFile is a non-test Go file of the repository: its path from the root,
// with slashes, and its content.
type goFile struct {
	rel  string
	body []byte
}

// productGoFiles reads every non-test Go file under the repository's root,
// leaving out hidden folders, testdata and the folders skip names (paths
// from the root). It fails the test when the walk finds fewer than 50,
// which means it is broken rather than that the repository is small.
func productGoFiles(t *testing.T, skip ...string) []goFile {
	t.Helper()
	root := filepath.Join("..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found: %v", err)
	}
	var files []goFile
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if (rel != "." && strings.HasPrefix(d.Name(), ".")) || d.Name() == "testdata" || slices.Contains(skip, rel) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files = append(files, goFile{rel: rel, body: b})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 50 {
		t.Fatalf("only %d Go files found under %s: the walk is broken", len(files), root)
	}
	return files
}
