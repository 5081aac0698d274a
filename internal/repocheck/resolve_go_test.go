package repocheck

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// resolveGo resolves a Go name exactly (see resolve).
func (tr *tree) resolveGo(span string, ctx []string) string {
	parts := strings.Split(span, ".")
	switch {
	case len(parts) == 1:
		return tr.resolveBare(span, ctx)
	case len(tr.byName[parts[0]]) > 0:
		return tr.resolveQualified(parts)
	case len(parts) == 2 && tr.external[parts[0]]:
		return tr.check(tr.selectors[span], "the code never uses %s", span)
	case len(parts) == 2:
		return tr.resolveMember(parts[0], parts[1], ctx)
	}
	return fmt.Sprintf("%s: no package %s in the repository", span, parts[0])
}

// resolveQualified: pkg.Name or pkg.Type.Member, in the packages named pkg.
func (tr *tree) resolveQualified(parts []string) string {
	for _, p := range tr.byName[parts[0]] {
		if len(parts) == 2 && p.decls[parts[1]] {
			return ""
		}
		if len(parts) == 3 && p.types[parts[1]] && p.members[parts[1]][parts[2]] {
			return ""
		}
	}
	if len(parts) == 2 {
		return fmt.Sprintf("package %s declares no %s", parts[0], parts[1])
	}
	return fmt.Sprintf("package %s declares no type %s with a method or field %s", parts[0], parts[1], parts[2])
}

// resolveMember: Type.Member, with Type from the paragraph's packages or
// else unique in the tree.
func (tr *tree) resolveMember(typ, member string, ctx []string) string {
	var in []*pkgSyms
	for _, d := range ctx {
		if p := tr.pkgs[d]; p != nil && p.types[typ] {
			in = append(in, p)
		}
	}
	where := "the paragraph's packages"
	if len(in) == 0 {
		where = "the tree"
		for _, p := range tr.pkgs {
			if p.types[typ] {
				in = append(in, p)
			}
		}
	}
	if len(in) == 0 {
		return fmt.Sprintf("no type %s is declared (packages of the paragraph: %v)", typ, ctx)
	}
	var has []string
	for _, p := range in {
		if p.members[typ][member] {
			has = append(has, p.dir)
		}
	}
	switch len(has) {
	case 1:
		return ""
	case 0:
		return fmt.Sprintf("type %s (in %s) has no method or field %s", typ, where, member)
	}
	return fmt.Sprintf("%s.%s is ambiguous: %v; name the package", typ, member, has)
}

// resolveBare: a name declared in the paragraph's packages, a package's
// name, or a name declared in exactly one package; else a directory, a
// build tag or a word of the code's strings and SQL.
func (tr *tree) resolveBare(name string, ctx []string) string {
	for _, d := range ctx {
		if p := tr.pkgs[d]; p != nil && p.declares(name) {
			return ""
		}
	}
	if len(tr.byName[name]) > 0 {
		return ""
	}
	var in []string
	for _, p := range tr.pkgs {
		if p.declares(name) {
			in = append(in, p.dir)
		}
	}
	if len(in) > 1 {
		return fmt.Sprintf("%s is declared in %v and in none of the paragraph's packages %v: ambiguous", name, in, ctx)
	}
	if len(in) == 1 || tr.buildTags[name] || tr.words[name] {
		return ""
	}
	if fi, err := os.Stat(filepath.Join(tr.root, name)); err == nil && fi.IsDir() {
		return ""
	}
	return fmt.Sprintf("%s is declared nowhere, and is no package, build tag or word of the code's strings", name)
}

// declares reports whether name is a top-level name or a member of one of
// p's types.
func (p *pkgSyms) declares(name string) bool {
	if p.decls[name] {
		return true
	}
	for _, m := range p.members {
		if m[name] {
			return true
		}
	}
	return false
}

// contextOf returns the dirs of the packages spans name: a file's or a
// directory's package, and the packages of a pkg. prefix.
func (tr *tree) contextOf(spans []string) []string {
	seen := map[string]bool{}
	var dirs []string
	add := func(d string) {
		for _, c := range []string{d, "internal/" + d} {
			if tr.pkgs[c] != nil && !seen[c] {
				seen[c] = true
				dirs = append(dirs, c)
			}
		}
	}
	for _, s := range spans {
		switch {
		case isPath(s) && pathExt.MatchString(s):
			add(filepath.ToSlash(filepath.Dir(s)))
		case isPath(s):
			add(strings.TrimSuffix(s, "/"))
		case goName.MatchString(s) && strings.Contains(s, "."):
			for _, p := range tr.byName[strings.Split(s, ".")[0]] {
				add(p.dir)
			}
			if p := tr.uniqueType(strings.Split(s, ".")[0]); p != nil {
				add(p.dir)
			}
		}
	}
	return dirs
}

// uniqueType is the one package that declares type typ, or nil.
func (tr *tree) uniqueType(typ string) *pkgSyms {
	var in *pkgSyms
	for _, p := range tr.pkgs {
		if p.types[typ] {
			if in != nil {
				return nil
			}
			in = p
		}
	}
	return in
}
