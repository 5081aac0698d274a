package relay

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/pgerr"
	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// fatalSentinels classifies every exported sentinel error of the packages
// whose errors reach Relay.Run: true ends the process, false is retried
// with backoff. TestFatalSentinelsListed makes a new sentinel without a
// row here fail, so none is retried forever by omission.
var fatalSentinels = map[string]struct {
	err   error
	fatal bool
}{
	"wal.ErrSchema":                 {wal.ErrSchema, true},
	"wal.ErrNotOutbox":              {wal.ErrNotOutbox, true},
	"wal.ErrRelationUnknown":        {wal.ErrRelationUnknown, false},
	"wal.ErrProtocol":               {wal.ErrProtocol, true},
	"wal.ErrUnsupported":            {wal.ErrUnsupported, true},
	"wal.ErrMalformed":              {wal.ErrMalformed, true},
	"publish.ErrNoExchange":         {publish.ErrNoExchange, false},
	"publish.ErrPoison":             {publish.ErrPoison, true},
	"publish.ErrNacked":             {publish.ErrNacked, false},
	"publish.ErrReturned":           {publish.ErrReturned, false},
	"publish.ErrConfirmTimeout":     {publish.ErrConfirmTimeout, false},
	"publish.ErrClosed":             {publish.ErrClosed, false},
	"slot.ErrPublication":           {slot.ErrPublication, true},
	"slot.ErrSlotMismatch":          {slot.ErrSlotMismatch, true},
	"slot.ErrSlotLost":              {slot.ErrSlotLost, true},
	"slot.ErrFailoverUnsupported":   {slot.ErrFailoverUnsupported, true},
	"slot.ErrSlotServer":            {slot.ErrSlotServer, true},
	"slot.ErrBusy":                  {slot.ErrBusy, false},
	"relay.ErrDatabaseShuttingDown": {ErrDatabaseShuttingDown, false},
}

// TestIsFatal: each sentinel is classified the same bare and wrapped, and
// so are the other errors a session meets.
func TestIsFatal(t *testing.T) {
	for name, c := range fatalSentinels {
		for _, err := range []error{c.err, fmt.Errorf("session: %w", c.err), fmt.Errorf("outer: %w", fmt.Errorf("inner: %w", c.err))} {
			if got := IsFatal(err); got != c.fatal {
				t.Errorf("IsFatal(%s as %q) = %v, want %v", name, err, got, c.fatal)
			}
		}
	}
	others := []struct {
		name  string
		err   error
		fatal bool
	}{
		{"nil", nil, false},
		{"plain", errors.New("connection reset by peer"), false},
		// A password or pg_hba.conf waits for an operator (classify,
		// TestClassify), retried so that the fix heals it without a
		// restart: never fatal, bare or as an OperatorError.
		{"invalid password", &pgconn.PgError{Code: pgerr.InvalidPassword}, false},
		{"invalid authorization", fmt.Errorf("connect: %w", &pgconn.PgError{Code: pgerr.InvalidAuthorizationSpec}), false},
		{"invalid password, needs an operator", fmt.Errorf("session: %w", &OperatorError{Problem: "p", Remedy: "r", Err: &pgconn.PgError{Code: pgerr.InvalidPassword}}), false},
		{"admin shutdown", &pgconn.PgError{Code: pgerr.AdminShutdown}, false},
		{"slot in use", &pgconn.PgError{Code: pgerr.ObjectInUse}, false},
		{"encode error", &publish.EncodeError{ID: "1", Reason: "too long"}, false},
	}
	for _, c := range others {
		if got := IsFatal(c.err); got != c.fatal {
			t.Errorf("IsFatal(%s) = %v, want %v", c.name, got, c.fatal)
		}
	}
}

// TestFatalSentinelsListed scans the packages' source for exported
// package-level Err variables and fails on any missing from fatalSentinels.
func TestFatalSentinelsListed(t *testing.T) {
	dirs := map[string]string{"wal": "../wal", "publish": "../publish", "slot": "../slot", "relay": "."}
	found := 0
	for pkg, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			for _, name := range sentinelNames(t, f) {
				found++
				if _, ok := fatalSentinels[pkg+"."+name]; !ok {
					t.Errorf("%s.%s (%s) is not classified: add it to fatalSentinels and, if a retry cannot help, to IsFatal", pkg, name, f)
				}
			}
		}
	}
	if found != len(fatalSentinels) {
		t.Errorf("found %d sentinels in the source, the table has %d: remove rows of deleted ones", found, len(fatalSentinels))
	}
}

// sentinelNames lists the exported package-level variables named Err* of
// one Go file.
func sentinelNames(t *testing.T, path string) []string {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), path, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, s := range g.Specs {
			for _, n := range s.(*ast.ValueSpec).Names {
				if strings.HasPrefix(n.Name, "Err") && n.IsExported() {
					names = append(names, n.Name)
				}
			}
		}
	}
	return names
}
