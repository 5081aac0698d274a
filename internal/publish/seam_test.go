package publish

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// amqpAdapter are the package's files that make up the AMQP sink: the only
// ones that may import amqp091-go (sink.go).
var amqpAdapter = []string{"amqpmsg.go", "link.go", "validate.go"}

// TestCoreSpeaksNoAMQP keeps the seam broker-neutral: no product file of
// the package but the AMQP adapter's imports amqp091-go, so no amqp091-go
// type can cross the seam (sink.go's interfaces are declared in a file
// that cannot name one) or be built by the core. A second sink is then an
// adapter of its own and runSinkConformance, without touching the core.
func TestCoreSpeaksNoAMQP(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var core, adapter int
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		imports := false
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(path, "github.com/rabbitmq/amqp091-go") {
				imports = true
			}
		}
		switch {
		case slices.Contains(amqpAdapter, name):
			adapter++
			if !imports {
				t.Errorf("%s is listed as the AMQP adapter but does not import amqp091-go: update amqpAdapter", name)
			}
		case imports:
			t.Errorf("%s imports amqp091-go, but it is not the AMQP adapter (%v): the core must reach the broker only through the sink (sink.go)", name, amqpAdapter)
		default:
			core++
		}
	}
	if adapter != len(amqpAdapter) {
		t.Errorf("found %d of the adapter's %d files %v", adapter, len(amqpAdapter), amqpAdapter)
	}
	if core < 10 {
		t.Errorf("only %d core files found: is the test running in the package's directory?", core)
	}
	t.Logf("%d core files, %d adapter files", core, adapter)
}
