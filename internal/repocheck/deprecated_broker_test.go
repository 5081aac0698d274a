package repocheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// brokerUse is one use of a broker feature that RabbitMQ 4.3, with its
// upstream defaults, refuses as deprecated: the suite runs against 4.3
// too, where a transient queue that is not exclusive fails with 541
// INTERNAL_ERROR and takes the whole connection down with it.
type brokerUse struct {
	pos     token.Position
	feature string // RabbitMQ's name of the deprecated feature, or what it is
	what    string // what the code does
}

// TestNoDeprecatedBrokerFeatures parses every Go file of the repository,
// test files and tagged files included, and fails on each use of a
// feature RabbitMQ 4.3 refuses: a test that declares one passes on 3.x
// and breaks on 4.3, and a product path that does stops the relay there.
func TestNoDeprecatedBrokerFeatures(t *testing.T) {
	root := filepath.Join("..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found: %v", err)
	}
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		checked++
		for _, u := range deprecatedBrokerUses(fset, f) {
			rel, err := filepath.Rel(root, u.pos.Filename)
			if err != nil {
				return err
			}
			t.Errorf("%s:%d: %s: RabbitMQ 4.3 refuses it (deprecated: %s)", filepath.ToSlash(rel), u.pos.Line, u.what, u.feature)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("only %d Go files parsed under %s: the walk is broken", checked, root)
	}
}

// deprecatedBrokerUses returns the uses of deprecated broker features in
// f: calls of amqp091-go's QueueDeclare(name, durable, autoDelete,
// exclusive, noWait, args) and QueueDeclarePassive with durable and
// exclusive both false, Qos(prefetchCount, prefetchSize, global) with
// global true, and queue arguments in a map literal that ask for a queue
// master locator or a classic queue of version 1. It judges the literal
// identifiers false and true only: the tree passes its flags as literals,
// and a flag computed at run time is the product's, not a test's.
func deprecatedBrokerUses(fset *token.FileSet, f *ast.File) []brokerUse {
	var uses []brokerUse
	add := func(n ast.Node, feature, what string) {
		uses = append(uses, brokerUse{pos: fset.Position(n.Pos()), feature: feature, what: what})
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			switch name := sel.Sel.Name; {
			case (name == "QueueDeclare" || name == "QueueDeclarePassive") && len(n.Args) >= 4 &&
				isIdent(n.Args[1], "false") && isIdent(n.Args[3], "false"):
				add(n, "transient_nonexcl_queues", name+" of a queue neither durable nor exclusive")
			case name == "Qos" && len(n.Args) >= 3 && isIdent(n.Args[2], "true"):
				add(n, "global_qos", "Qos with global true")
			}
		case *ast.CompositeLit:
			if !isArgumentMap(n.Type) {
				return true
			}
			for _, e := range n.Elts {
				kv, ok := e.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				switch key := stringLit(kv.Key); {
				case key == "x-queue-master-locator":
					add(kv, "queue_master_locator", "queue argument x-queue-master-locator")
				case key == "x-queue-mode":
					add(kv, "classic queue v1", "queue argument x-queue-mode")
				case key == "x-queue-version" && isOne(kv.Value):
					add(kv, "classic queue v1", "queue argument x-queue-version 1")
				}
			}
		}
		return true
	})
	return uses
}

// isArgumentMap tells whether a composite literal's type is one that
// carries AMQP arguments: amqp.Table (or Table, dot-imported) or a map
// from string to any or interface{}.
func isArgumentMap(typ ast.Expr) bool {
	switch typ := typ.(type) {
	case *ast.SelectorExpr:
		return typ.Sel.Name == "Table"
	case *ast.Ident:
		return typ.Name == "Table"
	case *ast.MapType:
		if !isIdent(typ.Key, "string") {
			return false
		}
		if isIdent(typ.Value, "any") {
			return true
		}
		i, ok := typ.Value.(*ast.InterfaceType)
		return ok && len(i.Methods.List) == 0
	}
	return false
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// stringLit returns the value of a string literal, "" for anything else.
func stringLit(e ast.Expr) string {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return ""
	}
	s, err := strconv.Unquote(lit.Value)
	if err != nil {
		return ""
	}
	return s
}

// isOne tells whether e is the integer literal 1, also in parentheses or
// converted to a sized integer (int32(1)): amqp.Table values are typed.
func isOne(e ast.Expr) bool {
	for {
		switch x := e.(type) {
		case *ast.ParenExpr:
			e = x.X
			continue
		case *ast.CallExpr:
			if fn, ok := x.Fun.(*ast.Ident); ok && len(x.Args) == 1 && strings.Contains(fn.Name, "int") {
				e = x.Args[0]
				continue
			}
			return false
		case *ast.BasicLit:
			if x.Kind != token.INT {
				return false
			}
			v, err := strconv.ParseInt(strings.ReplaceAll(x.Value, "_", ""), 0, 64)
			return err == nil && v == 1
		}
		return false
	}
}

// TestDeprecatedBrokerUsesDetector holds the detector to each form it must
// catch and to the forms it must leave alone, so that a clean tree means
// the check looked, not that it is blind.
func TestDeprecatedBrokerUsesDetector(t *testing.T) {
	for _, c := range []struct {
		name, body string
		want       []string // features found, in source order
	}{
		{"transient non-exclusive declare", `ch.QueueDeclare("q", false, true, false, false, nil)`, []string{"transient_nonexcl_queues"}},
		{"transient non-exclusive without auto-delete", `ch.QueueDeclare(name, false, false, false, false, args)`, []string{"transient_nonexcl_queues"}},
		{"transient non-exclusive passive", `ch.QueueDeclarePassive(q, false, true, false, false, nil)`, []string{"transient_nonexcl_queues"}},
		{"global qos", `ch.Qos(10, 0, true)`, []string{"global_qos"}},
		{"master locator in amqp.Table", `_ = amqp.Table{"x-queue-master-locator": "min-masters"}`, []string{"queue_master_locator"}},
		{"queue mode in map[string]any", `_ = map[string]any{"x-queue-mode": "lazy"}`, []string{"classic queue v1"}},
		{"queue version 1 in map[string]interface{}", `_ = map[string]interface{}{"x-queue-version": 1}`, []string{"classic queue v1"}},
		{"queue version int32(1)", `_ = amqp.Table{"x-max-length": int32(10), "x-queue-version": int32(1)}`, []string{"classic queue v1"}},
		{"raw string key", "_ = amqp.Table{`x-queue-master-locator`: \"client-local\"}", []string{"queue_master_locator"}},
		{"nested table", `_ = amqp.Table{"x-args": amqp.Table{"x-queue-mode": "lazy"}}`, []string{"classic queue v1"}},
		{"declare with deprecated arguments", `ch.QueueDeclare("q", false, false, false, false, amqp.Table{"x-queue-master-locator": "random"})`,
			[]string{"transient_nonexcl_queues", "queue_master_locator"}},

		{"durable queue", `ch.QueueDeclare("q", true, false, false, false, nil)`, nil},
		{"exclusive transient queue", `ch.QueueDeclare("q", false, true, true, false, nil)`, nil},
		{"durable passive", `ch.QueueDeclarePassive(q, true, false, false, false, nil)`, nil},
		{"flags computed at run time", `ch.QueueDeclare(q, durable, false, exclusive, false, nil)`, nil},
		{"per-consumer qos", `ch.Qos(1, 0, false)`, nil},
		{"queue version 2", `_ = amqp.Table{"x-queue-version": int32(2)}`, nil},
		{"other arguments", `_ = amqp.Table{"x-max-length": int64(10), "x-overflow": "reject-publish", "x-queue-type": "quorum"}`, nil},
		{"argument name compared, not set", `if name == "x-queue-master-locator" || name == "x-queue-mode" { return }`, nil},
		{"argument names in a slice", `_ = []string{"x-queue-master-locator", "x-queue-mode", "x-queue-version"}`, nil},
		{"map of another type", `_ = map[string]bool{"x-queue-mode": true}`, nil},
		{"unrelated method named like one", `s.Declare("q", false, true, false, false, nil)`, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := "package p\n\nfunc f() {\n\t" + c.body + "\n}\n"
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "snippet.go", src, parser.SkipObjectResolution)
			if err != nil {
				t.Fatalf("snippet does not parse: %v\n%s", err, src)
			}
			var got []string
			for _, u := range deprecatedBrokerUses(fset, f) {
				if u.pos.Line != 4 {
					t.Errorf("%s found at line %d, want 4 (the snippet's line)", u.feature, u.pos.Line)
				}
				got = append(got, u.feature)
			}
			if strings.Join(got, "|") != strings.Join(c.want, "|") {
				t.Errorf("%s: found %q, want %q", c.body, got, c.want)
			}
		})
	}
}
