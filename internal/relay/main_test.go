package relay_test

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMain removes the relay binary the process tests built, if any.
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}
