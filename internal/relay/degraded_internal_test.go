package relay

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/janitor"
)

// fakeMarksHealth reports what its fields say.
type fakeMarksHealth struct {
	failSince time.Time
	failErr   error
}

func (f *fakeMarksHealth) Failing() (time.Time, error) { return f.failSince, f.failErr }

// TestStatusDegraded: a streaming relay whose marks have failed for
// degradedAfter says so, with the cause (scrubbed, one line), and stops
// saying it once they succeed; a standby, whose janitor writes nothing,
// and a short failure do not.
func TestStatusDegraded(t *testing.T) {
	m := &fakeMarksHealth{}
	r := &Relay{cfg: config.Config{DatabaseURL: "postgres://relay:s3cr3t@db/app"}, marks: m}
	r.role.Store(int32(RoleStreaming))
	if got := r.Status(); got != "streaming" {
		t.Fatalf("healthy: %q", got)
	}
	m.failErr = errors.New("mark 3 events published: ERROR: permission denied for table event_outbox\n(password s3cr3t)")
	m.failSince = time.Now().Add(-degradedAfter / 2)
	if got := r.Status(); got != "streaming" {
		t.Fatalf("failing for less than %s: %q", degradedAfter, got)
	}
	m.failSince = time.Now().Add(-degradedAfter - 5*time.Second)
	got := r.Status()
	if !strings.HasPrefix(got, "streaming: degraded: marks failing for 25s, so the slot cannot advance: mark 3 events published: ERROR: permission denied") ||
		strings.Contains(got, "s3cr3t") || strings.Contains(got, "\n") {
		t.Fatalf("failing for 25s: %q", got)
	}
	r.setDetail(ReasonBrokerBlocked, "broker blocked publishers (resource alarm: memory); waiting, nothing is lost")
	if got := r.Status(); !strings.HasPrefix(got, "streaming: broker blocked publishers") || !strings.Contains(got, "nothing is lost: degraded: marks failing") {
		t.Fatalf("with a detail: %q", got)
	}
	r.role.Store(int32(RoleStandby))
	if got := r.Status(); strings.Contains(got, "degraded") {
		t.Fatalf("a standby: %q", got)
	}
	r.role.Store(int32(RoleStreaming))
	m.failSince, m.failErr = time.Time{}, nil
	r.clearDetail()
	if got := r.Status(); got != "streaming" {
		t.Fatalf("after a success: %q", got)
	}
	// Marks written but waiting for the standby that holds the slot.
	m.failSince, m.failErr = time.Now().Add(-degradedAfter-time.Second), &janitor.WaitError{What: "the standby that holds the slot (CDCRELAY_REPLICATION_URL) has not replayed the marks up to 0/3000060 yet"}
	if got := r.Status(); got != "streaming: degraded: marks waiting for 21s, so the slot cannot advance: the standby that holds the slot (CDCRELAY_REPLICATION_URL) has not replayed the marks up to 0/3000060 yet" {
		t.Fatalf("waiting for the standby: %q", got)
	}
}

// TestReason: cdcrelay_status's label follows the same state as Status,
// one reason at a time, the marks first while streaming.
func TestReason(t *testing.T) {
	m := &fakeMarksHealth{}
	r := &Relay{cfg: config.Config{}, marks: m}
	steps := []struct {
		name string
		set  func()
		want Reason
	}{
		{"a new relay", func() {}, ReasonConnecting},
		{"creating the slot", func() { r.setDetail(ReasonCreatingSlot, "creating replication slot s has waited 3s") }, ReasonCreatingSlot},
		{"backing off", func() { r.setDetail(r.retryDetail(errors.New("connection refused"))) }, ReasonRetrying},
		{"an operator's condition", func() { r.setDetail(r.retryDetail(&OperatorError{Problem: "p", Remedy: "q"})) }, ReasonNeedsOperator},
		{"streaming", func() { r.role.Store(int32(RoleStreaming)); r.clearDetail() }, ReasonOK},
		{"a blocked broker", func() { r.setDetail(ReasonBrokerBlocked, "broker blocked publishers") }, ReasonBrokerBlocked},
		{"marks failing briefly", func() { m.failSince, m.failErr = time.Now(), errors.New("denied") }, ReasonBrokerBlocked},
		{"marks failing", func() { m.failSince = time.Now().Add(-degradedAfter - time.Second) }, ReasonMarksFailing},
		{"marks waiting", func() { m.failErr = &janitor.WaitError{What: "standby"} }, ReasonMarksWaiting},
		{"a standby", func() { r.role.Store(int32(RoleStandby)); r.clearDetail() }, ReasonOK},
		{"starting again", func() { r.role.Store(int32(RoleStarting)) }, ReasonConnecting},
	}
	for _, s := range steps {
		s.set()
		if got := r.Reason(); got != s.want {
			t.Fatalf("%s: Reason %q, want %q (status %q)", s.name, got, s.want, r.Status())
		}
	}
}
