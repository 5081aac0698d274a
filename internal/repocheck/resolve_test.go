package repocheck

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// The rule for a backticked span of docs/architecture.md. Each span is one
// of these, tried in order, and each is checked against its own source:
//
//   - a test name (Test…, Fuzz…, Benchmark…; a trailing * matches a
//     prefix): a func of a _test.go file;
//   - CDCRELAY_NAME (optionally =value): an env tag of internal/config;
//   - CdcrelayAlert: an alert rule the Helm chart's templates name;
//   - cdcrelay_metric (a trailing * matches a prefix, {label="value"} is
//     allowed): a line of docs/metrics.txt, each label value a string
//     literal of the code;
//   - "make target": a target of the Makefile; "cdcrelay cmd": a string
//     literal (the subcommand's case) of cmd/cdcrelay;
//   - /path (an HTTP path) or -flag: a string literal of the code;
//   - a file or directory (it has a / or an extension): it exists under
//     the repository's root, under internal/, next to this page (docs/),
//     or in a package the same paragraph names;
//   - a Go name, dotted or bare: resolved exactly (resolveGo);
//   - a header name (cdcrelay-timeline): a string literal of the code;
//   - anything else is a phrase of SQL, a setting or a log line
//     (published_at IS NULL, wal_status = lost, connect <role>: …): its
//     longest word (placeholders <…> removed) must be a word of a string
//     literal of the code or of an SQL file.
//
// Fenced code blocks (the flow diagram) are not read.
//
// A Go name is resolved exactly, in the packages its paragraph (a list
// item, a table row) names by a file, a directory or a pkg. prefix:
//
//   - pkg.Name: Name is declared at the top level of a package pkg of the
//     repository; pkg.Type.Member: Member is a method, field or interface
//     method of Type there. A pkg outside the repository (signal) must be
//     used as pkg.Name somewhere in the code.
//   - Type.Member: Type is declared in a package of the paragraph, or, when
//     none declares it, in exactly one package of the tree; Member must be
//     Type's own there (Watermark.release never matches another type's
//     release).
//   - a bare name: declared (top level or member) in a package of the
//     paragraph, a package of the repository, or declared in exactly one
//     package of the tree; failing that, a directory, a build tag, or a
//     word of the code's string
//     literals or SQL (a value on the wire or in the database: park,
//     standby, published_at). A name declared in two packages and in none
//     of the paragraph's is ambiguous, and fails.
//
// resolve returns "" when span resolves, else why it does not. ctx are the
// dirs of the packages the span's paragraph names.
func (tr *tree) resolve(span string, ctx []string) string {
	switch {
	case testName.MatchString(span):
		return tr.resolveTest(span)
	case strings.HasPrefix(span, "CDCRELAY_"):
		name, _, _ := strings.Cut(span, "=")
		return tr.check(tr.envVars[name] || (name == "CDCRELAY_*" && len(tr.envVars) > 0), "no env tag %s in internal/config", strings.TrimPrefix(name, "CDCRELAY_"))
	case alertName.MatchString(span):
		return tr.resolveAlert(span)
	case strings.HasPrefix(span, "cdcrelay_"):
		return tr.resolveMetric(span)
	case strings.HasPrefix(span, "make "):
		return tr.resolveMakeTarget(strings.TrimPrefix(span, "make "))
	case strings.HasPrefix(span, "cdcrelay "):
		return tr.check(tr.literals[strings.TrimPrefix(span, "cdcrelay ")], "no subcommand %q in the code", strings.TrimPrefix(span, "cdcrelay "))
	case strings.HasPrefix(span, "/"), strings.HasPrefix(span, "-"):
		return tr.check(tr.literals[span] || tr.literals[strings.TrimPrefix(span, "-")], "no string literal %q in the code", span)
	case isPath(span):
		return tr.resolvePath(span, ctx)
	case goName.MatchString(span):
		return tr.resolveGo(span, ctx)
	case headerName.MatchString(span):
		return tr.check(tr.literals[span], "no string literal %q in the code", span)
	}
	return tr.resolvePhrase(span)
}

var (
	testName    = regexp.MustCompile(`^(?:Test|Fuzz|Benchmark)[A-Za-z0-9_]*\*?$`)
	goName      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*){0,2}$`)
	alertName   = regexp.MustCompile(`^Cdcrelay[A-Z][A-Za-z0-9]*$`)
	headerName  = regexp.MustCompile(`^[a-z][a-z0-9]*(?:-[a-z0-9]+)+$`)
	pathExt     = regexp.MustCompile(`\.(?:go|sql|md|txt|yaml|yml|json|sh)$`)
	placeholder = regexp.MustCompile(`<[^>]*>|…`)
)

func (tr *tree) check(ok bool, format string, args ...any) string {
	if ok {
		return ""
	}
	return fmt.Sprintf(format, args...)
}

func isPath(span string) bool {
	return !strings.ContainsAny(span, " =") && (strings.Contains(span, "/") || pathExt.MatchString(span))
}

func (tr *tree) resolveTest(span string) string {
	if prefix, ok := strings.CutSuffix(span, "*"); ok {
		for name := range tr.tests {
			if strings.HasPrefix(name, prefix) {
				return ""
			}
		}
		return fmt.Sprintf("no test matches %s", span)
	}
	return tr.check(tr.tests[span], "no test file declares func %s", span)
}

// resolveMetric: the name (or prefix) is a line of docs/metrics.txt, and
// each label value is a string literal of the code.
func (tr *tree) resolveMetric(span string) string {
	name, labels, _ := strings.Cut(span, "{")
	list, err := os.ReadFile(filepath.Join(tr.root, "docs", "metrics.txt"))
	if err != nil {
		return err.Error()
	}
	found := false
	for _, line := range strings.Split(string(list), "\n") {
		metric, _, _ := strings.Cut(line, " ")
		prefix, wild := strings.CutSuffix(name, "*")
		if metric == name || (wild && metric != "" && strings.HasPrefix(metric, prefix)) {
			found = true
			break
		}
	}
	if !found {
		return fmt.Sprintf("no metric %s in docs/metrics.txt", name)
	}
	for _, m := range labelValue.FindAllStringSubmatch(labels, -1) {
		if !tr.literals[m[1]] {
			return fmt.Sprintf("label value %q of %s is no string literal of the code", m[1], name)
		}
	}
	return ""
}

var labelValue = regexp.MustCompile(`"([^"]*)"`)

func (tr *tree) resolveMakeTarget(target string) string {
	mk, err := os.ReadFile(filepath.Join(tr.root, "Makefile"))
	if err != nil {
		return err.Error()
	}
	rule := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`)
	return tr.check(rule.Match(mk), "no target %s in the Makefile", target)
}

// resolvePath: a file or directory under the root, internal/, docs/, or
// a package dir of the paragraph.
func (tr *tree) resolvePath(span string, ctx []string) string {
	bases := append([]string{".", "internal", "docs"}, ctx...)
	for _, b := range bases {
		if _, err := os.Stat(filepath.Join(tr.root, filepath.FromSlash(path.Join(b, span)))); err == nil {
			return ""
		}
	}
	return fmt.Sprintf("no file or directory %s (from the root, internal/, docs/ or %v)", span, ctx)
}

// resolvePhrase: the phrase's longest word is a word of the code's string
// literals or SQL files.
func (tr *tree) resolvePhrase(span string) string {
	longest := ""
	for _, w := range identWord.FindAllString(placeholder.ReplaceAllString(span, ""), -1) {
		if len(w) > len(longest) {
			longest = w
		}
	}
	if longest == "" {
		return fmt.Sprintf("%q names nothing to check", span)
	}
	return tr.check(tr.words[longest], "%q: %s is no word of the code's string literals or SQL", span, longest)
}

// resolveAlert: the Helm chart's templates name the alert.
func (tr *tree) resolveAlert(name string) string {
	found := false
	err := filepath.WalkDir(filepath.Join(tr.root, "deploy", "helm", "cdcrelay", "templates"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || found {
			return err
		}
		src, err := os.ReadFile(p)
		found = strings.Contains(string(src), `"`+name+`"`)
		return err
	})
	if err != nil {
		return err.Error()
	}
	return tr.check(found, "no alert %s in deploy/helm/cdcrelay/templates", name)
}
