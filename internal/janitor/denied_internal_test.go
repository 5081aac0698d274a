package janitor

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// TestExplainDenied: the janitor's repeating warning names the privilege a
// permission error lacks, with the grant for the URL's role; other errors
// pass through unchanged.
func TestExplainDenied(t *testing.T) {
	j := &Janitor{opts: Options{DatabaseURL: "postgres://cdcrelay:pw@db/app", Outbox: config.Outbox{Schema: "public", Table: "event_outbox"}}}
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

// TestFailingReportsWaits: written marks that wait for a standby are
// reported by Failing, with a *WaitError and since when, while no write
// fails; a failing write takes precedence; the end of the wait clears it.
func TestFailingReportsWaits(t *testing.T) {
	j := &Janitor{}
	began := time.Now().Add(-time.Minute)
	j.awaitingStandby(began, &WaitError{What: "the standby has not replayed the marks up to 0/1 yet"})
	since, err := j.Failing()
	var w *WaitError
	if !since.Equal(began) || !errors.As(err, &w) {
		t.Fatalf("waiting: %v, %v", since, err)
	}
	j.failing(errors.New("permission denied"))
	if since, err := j.Failing(); since.Equal(began) || err == nil || err.Error() != "permission denied" {
		t.Fatalf("failing while waiting: %v, %v", since, err)
	}
	j.failing(nil)
	if since, err := j.Failing(); !since.Equal(began) || !errors.As(err, &w) {
		t.Fatalf("waiting again after the write succeeded: %v, %v", since, err)
	}
	j.awaitingStandby(began, nil)
	if since, err := j.Failing(); !since.IsZero() || err != nil {
		t.Fatalf("after the wait: %v, %v", since, err)
	}
}
