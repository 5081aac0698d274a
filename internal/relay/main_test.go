package relay_test

import (
	"os"
	"testing"
)

// TestMain removes the relay binary the process tests built, if any.
func TestMain(m *testing.M) {
	code := m.Run()
	builds.Remove()
	os.Exit(code)
}
