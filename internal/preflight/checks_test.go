package preflight

import "testing"

// TestFactLoaders: every fact has a loader, and following the facts a
// loader needs comes to an end (no fact needs itself), so need terminates
// and loads each fact after what it needs.
func TestFactLoaders(t *testing.T) {
	var visit func(f fact, path map[fact]bool)
	visit = func(f fact, path map[fact]bool) {
		l, ok := loaders[f]
		if !ok || l.load == nil {
			t.Fatalf("fact %d has no loader", f)
		}
		if path[f] {
			t.Fatalf("fact %d needs itself", f)
		}
		path[f] = true
		for _, n := range l.needs {
			visit(n, path)
		}
		delete(path, f)
	}
	for f := factSettings; f <= factSlot; f++ {
		visit(f, map[fact]bool{})
	}
	for i, c := range dbChecks {
		if c.run == nil {
			t.Fatalf("check %d has no run", i)
		}
		for _, n := range c.needs {
			visit(n, map[fact]bool{})
		}
	}
}
