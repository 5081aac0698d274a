package preflight_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/preflight"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	parser.close()
	os.Exit(code)
}

// sqlStart finds where a remedy names SQL: a command keyword in capitals,
// as remedies write them. The statement runs to the next semicolon.
var sqlStart = regexp.MustCompile(`\b(CREATE|ALTER|GRANT|REVOKE|DROP|SELECT|COMMENT ON|VACUUM|REINDEX|INSERT INTO|UPDATE|DELETE FROM)\b`)

// remedySQL returns the statements a remedy names. A statement written
// inside parentheses of prose keeps the prose's closing parentheses out.
func remedySQL(remedy string) []string {
	var out []string
	for rest := remedy; ; {
		loc := sqlStart.FindStringIndex(rest)
		if loc == nil {
			return out
		}
		end := strings.IndexByte(rest[loc[0]:], ';')
		if end < 0 {
			return out
		}
		stmt := rest[loc[0] : loc[0]+end]
		for strings.Count(stmt, ")") > strings.Count(stmt, "(") && strings.HasSuffix(stmt, ")") {
			stmt = strings.TrimSuffix(stmt, ")")
		}
		out = append(out, stmt+";")
		rest = rest[loc[0]+end+1:]
	}
}

func TestRemedySQL(t *testing.T) {
	got := remedySQL("end them (commit, roll back, or SELECT pg_terminate_backend(pid)); idle_in_transaction_session_timeout stops idle ones; ALTER SYSTEM SET a = '<x>'; SELECT pg_reload_conf(); and, then")
	want := []string{"SELECT pg_terminate_backend(pid);", "ALTER SYSTEM SET a = '<x>';", "SELECT pg_reload_conf();"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("remedySQL: %q, want %q", got, want)
	}
}

// sqlParser checks statements with PostgreSQL's own parser, on a server of
// its own, without running them: a PL/pgSQL function body is parsed when
// the function is created (check_function_bodies), each SQL statement in
// it by the core grammar.
type sqlParser struct {
	once sync.Once
	mu   sync.Mutex
	pg   *testenv.Postgres
	db   *pgx.Conn
	err  error
}

var parser sqlParser

func (p *sqlParser) start() {
	ctx := context.Background()
	p.pg, p.err = testenv.StartPostgres(ctx, testenv.PostgresOptions{})
	if p.err == nil {
		p.db, p.err = pgx.Connect(ctx, p.pg.URL("postgres"))
	}
}

func (p *sqlParser) close() {
	if p.db != nil {
		_ = p.db.Close(context.Background())
	}
	if p.pg != nil {
		_ = p.pg.Close()
	}
}

// parse returns the syntax error of stmt, if any.
func (p *sqlParser) parse(stmt string) error {
	p.once.Do(p.start)
	if p.err != nil {
		return fmt.Errorf("start the parsing server: %w", p.err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.db.Exec(context.Background(), `CREATE OR REPLACE FUNCTION pg_temp.remedy() RETURNS void LANGUAGE plpgsql AS $cdcrelay_remedy$ BEGIN `+stmt+` END $cdcrelay_remedy$`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code != "42601" {
		return fmt.Errorf("not a syntax error, but the function was refused: %w", err)
	}
	return err
}

// remediesParse holds every SQL statement a finding's remedy names to one
// that PostgreSQL parses: a user pastes them.
func remediesParse(t *testing.T, fs []preflight.Finding) {
	t.Helper()
	for _, f := range fs {
		for _, stmt := range remedySQL(f.Remedy) {
			if err := parser.parse(stmt); err != nil {
				t.Errorf("%s finding's remedy names SQL that does not parse: %s\n(%v)\nremedy: %s", f.Check, stmt, err, f.Remedy)
			}
		}
	}
}

// TestRemedyParserRejects: the parser refuses what is not SQL, so that
// remediesParse can fail.
func TestRemedyParserRejects(t *testing.T) {
	if err := parser.parse("ALTER TABLE t ADD COLUMN x int, ADD COLUMN y;"); err == nil {
		t.Fatal("a statement with a column without a type parsed")
	}
	if err := parser.parse(`CREATE INDEX CONCURRENTLY IF NOT EXISTS "x_idx" ON public.t (enqueued_at) WHERE published_at IS NOT NULL;`); err != nil {
		t.Fatalf("a valid statement: %v", err)
	}
}
