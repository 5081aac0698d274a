package repocheck

import (
	"bytes"
	"testing"
)

// maxLines bounds every non-test Go file: a file longer than this holds
// more than one concern and is split by concern (docs/testing.md).
const maxLines = 500

// TestNoLargeGoFiles fails on any non-test Go file above maxLines lines.
func TestNoLargeGoFiles(t *testing.T) {
	for _, f := range productGoFiles(t) {
		if n := bytes.Count(f.body, []byte("\n")); n > maxLines {
			t.Errorf("%s has %d lines; split it by concern (at most %d)", f.rel, n, maxLines)
		}
	}
}
