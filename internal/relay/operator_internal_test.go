package relay

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestReplicationDenied: only the walsender's refusal (the wording of
// PostgreSQL 16+ and of 13-15) is a missing REPLICATION attribute; another
// 42501 on connecting (no CONNECT on the database) is left as it is.
func TestReplicationDenied(t *testing.T) {
	for msg, want := range map[string]bool{
		"permission denied to start WAL sender":                    true,
		"must be superuser or replication role to start walsender": true,
		`permission denied for database "app"`:                     false,
	} {
		err := fmt.Errorf("connect: %w", &pgconn.PgError{Severity: "FATAL", Code: "42501", Message: msg})
		got := replicationDenied(err, "relay")
		var op *OperatorError
		if errors.As(got, &op) != want {
			t.Errorf("%q: %v", msg, got)
		}
		if want && (op.Remedy != "ALTER ROLE relay REPLICATION; (as a superuser; on RDS/Aurora: GRANT rds_replication TO relay;)" || !errors.Is(got, err.(interface{ Unwrap() error }).Unwrap())) {
			t.Errorf("%q: remedy %q, or the server's error not kept: %v", msg, op.Remedy, got)
		}
	}
	other := errors.New("dial tcp: connection refused")
	if got := replicationDenied(other, "relay"); !errors.Is(got, other) || got.Error() != other.Error() {
		t.Errorf("a non-PostgreSQL error changed: %v", got)
	}
}
