package janitor

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestExplainDenied: the janitor's repeating warning names the privilege a
// permission error lacks, with the grant for the URL's role; other errors
// pass through unchanged.
func TestExplainDenied(t *testing.T) {
	j := &Janitor{opts: Options{DatabaseURL: "postgres://cdcrelay:pw@db/app", Schema: "public", Table: "event_outbox"}}
	denied := fmt.Errorf("mark published: %w", &pgconn.PgError{Severity: "ERROR", Code: "42501", Message: "permission denied for table event_outbox"})
	want := "mark published: ERROR: permission denied for table event_outbox (SQLSTATE 42501): the relay's role needs UPDATE (published_at, attempts, last_error) on \"public\".\"event_outbox\" to mark rows published: GRANT UPDATE (published_at, attempts, last_error) ON \"public\".\"event_outbox\" TO \"cdcrelay\"; (docs/least-privilege.md)"
	got := j.explainDenied(denied)
	if got.Error() != want || !errors.Is(got, denied) {
		t.Errorf("explainDenied:\n got %s\nwant %s", got, want)
	}
	other := errors.New("connection refused")
	if got := j.explainDenied(other); got.Error() != other.Error() {
		t.Errorf("explainDenied changed another error: %v", got)
	}
}
