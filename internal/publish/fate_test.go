package publish

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Short names for the table below.
const (
	retry    = actRetry
	remember = actRemember
	stall    = actStall
	stop     = actStop
	park     = actPark
	parkCopy = actParkCopy
)

// fateColumns are the policies, in the order of fateTable's columns:
// CDCRELAY_UNROUTABLE, CDCRELAY_POISON, and whether a dead-letter exchange
// is configured.
var fateColumns = [...]policy{
	{StallUnroutable, Stop, false}, {StallUnroutable, Stop, true},
	{StallUnroutable, Park, false}, {StallUnroutable, Park, true},
	{ParkUnroutable, Stop, false}, {ParkUnroutable, Stop, true},
	{ParkUnroutable, Park, false}, {ParkUnroutable, Park, true},
}

// fateTable is the whole broker-side policy: one row per cause, one column
// per policy (fateColumns).
var fateTable = map[cause][len(fateColumns)]action{
	//                   unroutable: stall ------------------------   park ---------------------------------
	//                   poison:     stop          park               stop          park
	//                   dlx:        -     set     -     set          -     set     -       set
	causeContent:       {stop, stop, park, parkCopy, stop, stop, park, parkCopy},
	causeEncode:        {remember, remember, remember, remember, remember, remember, remember, remember},
	causeBrokerRefused: {remember, remember, remember, remember, remember, remember, remember, remember},
	causeUnroutable:    {stall, stall, stall, stall, stop, stop, park, parkCopy},
	causeNoExchange:    {stall, stall, stall, stall, remember, remember, remember, remember},
	causeNack:          {retry, retry, retry, retry, retry, retry, retry, retry},
	causeClosed:        {retry, retry, retry, retry, retry, retry, retry, retry},
	causeTransport:     {retry, retry, retry, retry, retry, retry, retry, retry},
	causeTimeout:       {retry, retry, retry, retry, retry, retry, retry, retry},
	causeCopyNotTaken:  {park, park, park, park, park, park, park, park},
	causeCopyRefused:   {remember, remember, remember, remember, remember, remember, remember, remember},
}

// TestFateTable: decide gives, for every cause under every policy, the
// action the table above says.
func TestFateTable(t *testing.T) {
	for c, row := range fateTable {
		for i, pol := range fateColumns {
			if got, want := decide(c, pol), row[i]; got != want {
				t.Errorf("decide(%s, %+v) = %s, want %s", causeNames[c], pol, actionNames[got], actionNames[want])
			}
		}
	}
}

// TestFateTableIsComplete: every cause has a row and every policy value a
// column, so that a new cause, a new poison or unroutable policy, or a new
// action cannot be added without deciding, here, what it does everywhere.
func TestFateTableIsComplete(t *testing.T) {
	consts := constsByType(t)
	if got := consts["cause"]; len(got) != len(fateTable) || len(got) != len(causeNames) {
		t.Fatalf("causes %v: fateTable has %d rows, causeNames %d: give each cause a row", got, len(fateTable), len(causeNames))
	}
	for c := range cause(len(consts["cause"])) {
		if _, ok := fateTable[c]; !ok {
			t.Errorf("cause %d (%s) has no row in fateTable", c, causeNames[c])
		}
	}
	if got := consts["action"]; len(got) != len(actionNames) {
		t.Errorf("actions %v: actionNames has %d", got, len(actionNames))
	}
	poison, unroutable := consts["PoisonPolicy"], consts["UnroutablePolicy"]
	if want := len(poison) * len(unroutable) * 2; want != len(fateColumns) {
		t.Fatalf("poison policies %v, unroutable policies %v: fateColumns has %d columns, want %d", poison, unroutable, len(fateColumns), want)
	}
	seen := map[policy]bool{}
	for _, pol := range fateColumns {
		if int(pol.poison) >= len(poison) || int(pol.unroutable) >= len(unroutable) || seen[pol] {
			t.Errorf("column %+v: not a policy, or twice", pol)
		}
		seen[pol] = true
	}
}

// TestFateReadsTheConfig: the policy decide sees is the configuration's.
func TestFateReadsTheConfig(t *testing.T) {
	cfg := PublisherConfig{Poison: Stop, Unroutable: ParkUnroutable, DeadLetterExchange: "dlx"}
	if got, want := cfg.policy(), (policy{ParkUnroutable, Stop, true}); got != want {
		t.Fatalf("policy %+v, want %+v", got, want)
	}
	if got := (&PublisherConfig{}).policy(); got != (policy{StallUnroutable, Park, false}) {
		t.Fatalf("default policy %+v", got)
	}
}

var causeNames = map[cause]string{
	causeContent: "content", causeEncode: "encode", causeBrokerRefused: "broker-refused",
	causeUnroutable: "unroutable", causeNoExchange: "no-exchange", causeNack: "nack", causeClosed: "closed",
	causeTransport: "transport", causeTimeout: "timeout", causeCopyNotTaken: "copy-not-taken",
	causeCopyRefused: "copy-refused",
}

var actionNames = map[action]string{
	actRetry: "retry", actRemember: "remember", actStall: "stall", actStop: "stop", actPark: "park",
	actParkCopy: "park+copy",
}

// constsByType lists, by type name, the constants this package's non-test
// files declare with an explicit type or as its iota continuation.
func constsByType(t *testing.T) map[string][]string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			collectConsts(d, out)
		}
	}
	return out
}

func collectConsts(d ast.Decl, out map[string][]string) {
	g, ok := d.(*ast.GenDecl)
	if !ok || g.Tok != token.CONST {
		return
	}
	typ := ""
	for _, s := range g.Specs {
		v := s.(*ast.ValueSpec)
		switch {
		case v.Type != nil:
			typ = ""
			if id, ok := v.Type.(*ast.Ident); ok {
				typ = id.Name
			}
		case len(v.Values) > 0:
			typ = "" // an untyped constant ends the iota run
		}
		if typ == "" {
			continue
		}
		for _, n := range v.Names {
			out[typ] = append(out[typ], n.Name)
		}
	}
}
