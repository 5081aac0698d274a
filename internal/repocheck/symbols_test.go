package repocheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// pkgSyms is what one directory's non-test Go files declare.
type pkgSyms struct {
	dir     string                     // slash path from the repository root: internal/relay
	name    string                     // the package clause: relay
	decls   map[string]bool            // top-level funcs, types, vars and consts
	types   map[string]bool            // the top-level types among them
	members map[string]map[string]bool // type → its methods, fields and interface methods
}

// tree is the repository as the resolver sees it: every package's
// declarations, the test functions, and the texts names on the wire or in
// the database are checked against.
type tree struct {
	root      string
	pkgs      map[string]*pkgSyms   // by dir
	byName    map[string][]*pkgSyms // by package clause and by the dir's last element
	tests     map[string]bool       // Test, Fuzz and Benchmark funcs of every _test.go file
	selectors map[string]bool       // pkg.Name selectors on packages outside the repository
	external  map[string]bool       // names of the packages outside the repository that are imported
	buildTags map[string]bool       // words of the //go:build lines
	words     map[string]bool       // words of the string literals (non-test) and of the SQL files
	literals  map[string]bool       // the string literals themselves (non-test)
	envVars   map[string]bool       // CDCRELAY_* names from internal/config's env tags
}

// loadTree parses every Go file under root (go/parser), skipping .git,
// node_modules and testdata.
func loadTree(t testing.TB, root string) *tree {
	t.Helper()
	tr := &tree{root: root, pkgs: map[string]*pkgSyms{}, byName: map[string][]*pkgSyms{}, tests: map[string]bool{},
		selectors: map[string]bool{}, external: map[string]bool{}, buildTags: map[string]bool{}, words: map[string]bool{},
		literals: map[string]bool{}, envVars: map[string]bool{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		switch {
		case d.IsDir():
			return nil
		case strings.HasSuffix(p, ".sql"):
			src, err := os.ReadFile(p)
			tr.addWords(string(src))
			return err
		case !strings.HasSuffix(p, ".go"):
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		tr.addFile(path.Dir(rel), f, strings.HasSuffix(p, "_test.go"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tr.pkgs {
		tr.byName[p.name] = append(tr.byName[p.name], p)
		if base := path.Base(p.dir); base != p.name {
			tr.byName[base] = append(tr.byName[base], p)
		}
	}
	return tr
}

// modulePath is this repository's module: its imports are not external.
const modulePath = "github.com/cdcrelay/cdcrelay"

// addFile records one parsed file: a test file gives only its test funcs.
func (tr *tree) addFile(dir string, f *ast.File, test bool) {
	for _, cg := range f.Comments {
		for _, c := range cg.List {
			if tags, ok := strings.CutPrefix(c.Text, "//go:build "); ok {
				for _, w := range identWord.FindAllString(tags, -1) {
					tr.buildTags[w] = true
				}
			}
		}
	}
	if test {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
				tr.tests[fd.Name.Name] = true
			}
		}
		return
	}
	p := tr.pkgs[dir]
	if p == nil {
		p = &pkgSyms{dir: dir, name: f.Name.Name, decls: map[string]bool{}, types: map[string]bool{}, members: map[string]map[string]bool{}}
		tr.pkgs[dir] = p
	}
	for _, imp := range f.Imports {
		ip, _ := strconv.Unquote(imp.Path.Value)
		if !strings.HasPrefix(ip, modulePath) {
			name := path.Base(ip)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			tr.external[name] = true
		}
	}
	for _, d := range f.Decls {
		p.addDecl(d)
	}
	ast.Inspect(f, tr.inspect(dir))
}

// inspect records string literals, external selectors and env tags.
func (tr *tree) inspect(dir string) func(ast.Node) bool {
	return func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BasicLit:
			if n.Kind == token.STRING {
				s, err := strconv.Unquote(n.Value)
				if err == nil {
					tr.literals[s] = true
					tr.addWords(s)
				}
			}
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok {
				tr.selectors[x.Name+"."+n.Sel.Name] = true
			}
		case *ast.Field:
			if n.Tag != nil && dir == "internal/config" {
				tag, _ := strconv.Unquote(n.Tag.Value)
				if m := envTag.FindStringSubmatch(tag); m != nil {
					tr.envVars["CDCRELAY_"+m[1]] = true
				}
			}
		}
		return true
	}
}

var (
	identWord = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
	envTag    = regexp.MustCompile(`env:"([A-Z0-9_]+)`)
)

func (tr *tree) addWords(s string) {
	for _, w := range identWord.FindAllString(s, -1) {
		tr.words[w] = true
	}
}

// addDecl records a top-level declaration and, for a type, its fields and
// interface methods; for a method, the method on its receiver's type.
func (p *pkgSyms) addDecl(d ast.Decl) {
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil || len(d.Recv.List) == 0 {
			p.decls[d.Name.Name] = true
			return
		}
		p.member(receiverType(d.Recv.List[0].Type), d.Name.Name)
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				p.decls[s.Name.Name], p.types[s.Name.Name] = true, true
				p.typeMembers(s.Name.Name, s.Type)
			case *ast.ValueSpec:
				for _, n := range s.Names {
					p.decls[n.Name] = true
				}
			}
		}
	}
}

func (p *pkgSyms) member(typ, name string) {
	if p.members[typ] == nil {
		p.members[typ] = map[string]bool{}
	}
	p.members[typ][name] = true
}

// typeMembers records a struct's fields (an embedded field by its type's
// name) and an interface's methods.
func (p *pkgSyms) typeMembers(typ string, expr ast.Expr) {
	var fields *ast.FieldList
	switch x := expr.(type) {
	case *ast.StructType:
		fields = x.Fields
	case *ast.InterfaceType:
		fields = x.Methods
	default:
		return
	}
	for _, f := range fields.List {
		for _, n := range f.Names {
			p.member(typ, n.Name)
		}
		if len(f.Names) == 0 {
			p.member(typ, receiverType(f.Type))
		}
	}
}

// receiverType is the type name of a receiver or embedded field: T, *T,
// T[K], pkg.T.
func receiverType(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return receiverType(x.X)
	case *ast.IndexExpr:
		return receiverType(x.X)
	case *ast.IndexListExpr:
		return receiverType(x.X)
	case *ast.SelectorExpr:
		return x.Sel.Name
	case *ast.Ident:
		return x.Name
	}
	return ""
}
