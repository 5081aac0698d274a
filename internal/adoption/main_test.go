package adoption

import (
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/testenv/leak"
)

// TestMain fails the run if a test leaves a goroutine behind
// (docs/testing.md, "Goroutine leaks").
func TestMain(m *testing.M) { leak.Main(m) }
