package preflight

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationReadOnlyWithTargetSessionAttrs: a URL with
// target_session_attrs=read-write connects (as run's connections do)
// through check's session options, and the session is still read-only, so
// check cannot write.
func TestIntegrationReadOnlyWithTargetSessionAttrs(t *testing.T) {
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	ctx := context.Background()
	for _, attrs := range []string{"read-write", "primary", "any"} {
		t.Run(attrs, func(t *testing.T) {
			url := pg.URL("postgres") + "&target_session_attrs=" + attrs
			db, err := pgconnect.Connect(ctx, url, "to database", checkSession(Options{Timeout: DefaultTimeout}, nil))
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer func() { _ = db.Close(ctx) }()
			var ro string
			if err := db.QueryRow(ctx, "SHOW transaction_read_only").Scan(&ro); err != nil || ro != "on" {
				t.Fatalf("transaction_read_only = %q, %v; want on", ro, err)
			}
			_, err = db.Exec(ctx, "CREATE TABLE preflight_must_not_write (a int)")
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "25006" { // read_only_sql_transaction
				t.Fatalf("a write in the check's session: %v, want SQLSTATE 25006", err)
			}
		})
	}
}
