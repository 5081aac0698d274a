package inbox_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/inbox"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// killedBySIGKILL fails the test unless the child ended by SIGKILL.
func killedBySIGKILL(t *testing.T, p *testenv.Process) {
	t.Helper()
	err := p.Wait(t, 60*time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child ended with %v, want killed", err)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL", err)
	}
}

// TestIntegrationCrashAfterEffectBeforeAck: a consumer process commits
// m3's effect and is killed before its ack reaches the broker; another
// consumer gets m3 again, with m4 and m5. Every effect is applied once, and
// the second consumer counts m3 as its one duplicate.
func TestIntegrationCrashAfterEffectBeforeAck(t *testing.T) {
	e := setup(t)
	for i, id := range []string{"m1", "m2", "m3", "m4", "m5"} {
		e.publish(t, id, "orders.1", "0/10", int64(i))
	}
	child := testenv.StartProcess(t, os.Args[0], childEnv(e, "tx", "m3", time.Second, ""))
	killedBySIGKILL(t, child)
	if got := e.effects(t); len(got) != 3 || got["m3"] != 1 {
		t.Fatalf("effects after the crash %v, want m1, m2 and m3 (committed, not acked)", got)
	}

	ib, reg := newInbox(t, e, time.Second)
	_, msgs := e.consume(t, 10)
	results := map[string]inbox.Result{}
	for range 3 {
		d := next(t, msgs)
		res, err := ib.Handle(t.Context(), d, "effects", insertEffect)
		if err != nil {
			t.Fatalf("%s: %v", d.MessageId, err)
		}
		results[d.MessageId] = res
	}
	if results["m3"] != inbox.Duplicate || results["m4"] != inbox.Handled || results["m5"] != inbox.Handled {
		t.Errorf("second consumer: %v; want m3 duplicate, m4 and m5 handled", results)
	}
	got := e.effects(t)
	for _, id := range []string{"m1", "m2", "m3", "m4", "m5"} {
		if got[id] != 1 {
			t.Errorf("effect of %s applied %d times, want once (all: %v)", id, got[id], got)
		}
	}
	if n := counter(t, reg, "cdcrelay_inbox_duplicates_total"); n != 1 {
		t.Errorf("cdcrelay_inbox_duplicates_total = %v, want 1", n)
	}
	if n := counter(t, reg, "cdcrelay_inbox_handled_total"); n != 2 {
		t.Errorf("cdcrelay_inbox_handled_total = %v, want 2", n)
	}
	waitFor(t, 10*time.Second, "the queue empty", func() bool { return e.messages(t, e.queue) == 0 })
}

// TestIntegrationLeaseExpiryRetriesCrashedHandler: a consumer process
// claims m1 with a 2 s lease, has its effect outside the database and is
// killed before it marks the claim done. The redelivered copy waits for the
// lease, takes the claim over (attempt 2) and runs the handler again: the
// effect is retried, not lost, and the takeover is counted.
func TestIntegrationLeaseExpiryRetriesCrashedHandler(t *testing.T) {
	e := setup(t)
	const lease = 2 * time.Second
	effects := filepath.Join(t.TempDir(), "effects")
	e.publish(t, "m1", "orders.1", "0/10", 0)
	child := testenv.StartProcess(t, os.Args[0], childEnv(e, "effect", "m1", lease, effects))
	killedBySIGKILL(t, child)
	if got := fileLines(t, effects); len(got) != 1 || got[0] != "m1:1" {
		t.Fatalf("effects after the crash %v, want [m1:1]", got)
	}
	var leaseUntil time.Time
	var state string
	if err := e.conn.QueryRow(t.Context(), `SELECT state, lease_until FROM cdcrelay_inbox WHERE message_id = 'm1'`).
		Scan(&state, &leaseUntil); err != nil || state != "claimed" {
		t.Fatalf("the crashed claim: %q, %v; want claimed", state, err)
	}

	ib, reg := newInbox(t, e, lease)
	_, msgs := e.consume(t, 10)
	d := next(t, msgs)
	var ranAt time.Time
	var attempt int
	res, err := ib.HandleEffect(t.Context(), d, "mailer", func(_ context.Context, ev inbox.Event) error {
		ranAt, attempt = time.Now(), ev.Attempt
		return appendEffect(effects, ev)
	})
	if res != inbox.Handled || err != nil {
		t.Fatalf("HandleEffect after the crash: %v, %v; want handled", res, err)
	}
	if attempt != 2 {
		t.Errorf("the retry ran as attempt %d, want 2", attempt)
	}
	// The database's clock and ours are the same machine's.
	if ranAt.Before(leaseUntil) {
		t.Errorf("the retry ran at %v, before the crashed claim's lease ended at %v", ranAt, leaseUntil)
	}
	if got := fileLines(t, effects); len(got) != 2 || got[1] != "m1:2" {
		t.Errorf("effects %v, want [m1:1 m1:2]", got)
	}
	if n := counter(t, reg, "cdcrelay_inbox_claims_taken_over_total"); n != 1 {
		t.Errorf("cdcrelay_inbox_claims_taken_over_total = %v, want 1", n)
	}
	var attempts int
	if err := e.conn.QueryRow(t.Context(), `SELECT state, attempts FROM cdcrelay_inbox WHERE message_id = 'm1'`).
		Scan(&state, &attempts); err != nil || state != "done" || attempts != 2 {
		t.Errorf("the claim: %q after %d attempts (%v); want done after 2", state, attempts, err)
	}
}

// TestIntegrationStaleOwnerCannotOverwrite: consumer A's claim is taken
// over by B while A's handler still runs (A's lease made to expire by
// hand, before A's first renewal). B marks the claim done; A's conditioned
// UPDATE then changes nothing, and A learns it lost the lease.
func TestIntegrationStaleOwnerCannotOverwrite(t *testing.T) {
	e := setup(t)
	ibA, regA := newInbox(t, e, 30*time.Second) // renews every 10 s: not during the test
	ibB, regB := newInbox(t, e, 30*time.Second)
	e.publish(t, "m1", "orders.1", "0/10", 0)
	connA, msgsA := e.consume(t, 10)
	d := next(t, msgsA)
	started, release := make(chan struct{}), make(chan struct{})
	type outcome struct {
		res inbox.Result
		err error
	}
	doneA := make(chan outcome, 1)
	go func() {
		res, err := ibA.HandleEffect(context.Background(), d, "mailer", func(context.Context, inbox.Event) error {
			close(started)
			<-release
			return nil
		})
		doneA <- outcome{res, err}
	}()
	<-started
	if _, err := e.conn.Exec(t.Context(), `UPDATE cdcrelay_inbox SET lease_until = clock_timestamp() - interval '1 second' WHERE message_id = 'm1'`); err != nil {
		t.Fatal(err)
	}
	// B gets the message again: A's connection is lost (A's handler goes
	// on regardless).
	if err := connA.Close(); err != nil {
		t.Fatal(err)
	}
	_, msgsB := e.consume(t, 10)
	var attemptB int
	res, err := ibB.HandleEffect(t.Context(), next(t, msgsB), "mailer", func(_ context.Context, ev inbox.Event) error {
		attemptB = ev.Attempt
		return nil
	})
	if res != inbox.Handled || err != nil || attemptB != 2 {
		t.Fatalf("B: %v, %v, attempt %d; want handled as attempt 2", res, err, attemptB)
	}
	close(release)
	a := <-doneA
	if !errors.Is(a.err, inbox.ErrLeaseLost) {
		t.Errorf("A: %v, %v; want ErrLeaseLost", a.res, a.err)
	}
	var state string
	var owner *string
	if err := e.conn.QueryRow(t.Context(), `SELECT state, owner FROM cdcrelay_inbox WHERE message_id = 'm1'`).Scan(&state, &owner); err != nil ||
		state != "done" || owner != nil {
		t.Errorf("the claim after A finished: %q, owner %v (%v); want done by B", state, owner, err)
	}
	if n := counter(t, regB, "cdcrelay_inbox_claims_taken_over_total"); n != 1 {
		t.Errorf("B took over %v claims, want 1", n)
	}
	if n := counter(t, regA, "cdcrelay_inbox_handler_errors_total"); n != 1 {
		t.Errorf("A counted %v handler errors, want 1 (the lost lease)", n)
	}
}
