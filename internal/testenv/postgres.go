package testenv

import (
	"context"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/svckit"
	"github.com/cdcrelay/cdcrelay/internal/svckit/pgcluster"
)

// PGBinEnv overrides the directory holding initdb, pg_ctl and postgres.
const PGBinEnv = pgcluster.PGBinEnv

// PostgresOptions tunes a throwaway cluster.
type PostgresOptions = pgcluster.PostgresOptions

// StandbyOptions tunes a standby (Postgres.StartStandby).
type StandbyOptions = pgcluster.StandbyOptions

// Postgres is a throwaway PostgreSQL cluster (pgcluster.Postgres, whose
// methods it has) with the methods only tests use on top, such as
// StartRecvLogical. A defined type rather than an alias, since those
// methods take a testing.TB the service kit must not import.
type Postgres struct{ *pgcluster.Postgres }

// StartPostgres is pgcluster.StartPostgres: the caller must Close the
// cluster. Tests use MustPostgres.
func StartPostgres(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	p, err := pgcluster.StartPostgres(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &Postgres{p}, nil
}

// StartStandby is pgcluster's StartStandby, returning this package's
// Postgres. Tests use MustStandby.
func (p *Postgres) StartStandby(ctx context.Context, opts StandbyOptions) (*Postgres, error) {
	s, err := p.Postgres.StartStandby(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &Postgres{s}, nil
}

// PGMajor is the major version of the server binaries the clusters run
// (pgcluster.PGMajor).
func PGMajor() (int, error) { return pgcluster.PGMajor() }

// Tail returns the last n lines of s: the part of a long log worth
// showing when a test fails.
func Tail(s string, n int) string { return svckit.Tail(s, n) }

// MustStandby starts a standby of p for the test (StartStandby) and removes
// it when the test ends, logging its server log first if the test failed.
func MustStandby(tb testing.TB, p *Postgres, opts StandbyOptions) *Postgres {
	tb.Helper()
	RequireIntegration(tb, "PostgreSQL")
	ctx, cancel := context.WithTimeout(context.Background(), 2*setupTimeout)
	defer cancel()
	s, err := p.StartStandby(ctx, opts)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("standby server log (last 50 lines, %s):\n%s", s.DataDir(), Tail(s.ServerLog(), 50))
		}
		if err := s.Close(); err != nil {
			tb.Errorf("close standby: %v", err)
		}
	})
	return s
}

// RequireMajor fails tb on a server older than major: skipping would let
// a run on the wrong binaries pass without testing anything. make
// test-pg-matrix picks the binaries.
func RequireMajor(tb testing.TB, major int) {
	tb.Helper()
	got, err := PGMajor()
	if err != nil {
		tb.Fatal(err)
	}
	if got < major {
		tb.Fatalf("this test needs PostgreSQL %d or later, and %s points at %d: run it with make test-pg-matrix, or set %s", major, PGBinEnv, got, PGBinEnv)
	}
}
