package inbox

import (
	"fmt"
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	now := time.Unix(1000, 0)
	cases := []struct {
		name string
		row  ledgerRow
		want action
	}{
		{"no row", ledgerRow{}, actClaim},
		{"done", ledgerRow{exists: true, done: true, attempts: 1}, actDuplicate},
		{"released", ledgerRow{exists: true, attempts: 1}, actRetry},
		{"live lease", ledgerRow{exists: true, owner: "a", leaseUntil: now.Add(time.Nanosecond), attempts: 1}, actWait},
		{"lease ends now", ledgerRow{exists: true, owner: "a", leaseUntil: now, attempts: 1}, actTakeOver},
		{"expired lease", ledgerRow{exists: true, owner: "a", leaseUntil: now.Add(-time.Second), attempts: 1}, actTakeOver},
	}
	for _, c := range cases {
		if got := decide(c.row, now); got != c.want {
			t.Errorf("%s: decide = %v, want %v", c.name, got, c.want)
		}
	}
}

// model is the ledger row of one message and the consumers acting on it,
// driven by the pure transitions the SQL applies.
type model struct {
	row       ledgerRow
	now       time.Time
	lease     time.Duration
	running   map[string]time.Time // owners whose handler is running: the lease each last took or renewed
	runs      int                  // handler runs started
	completes int                  // successful mark-done updates
	nextOwner int
}

// step applies one operation chosen by op to the model and checks the
// invariants after it.
func (m *model) step(t *testing.T, op, arg byte) {
	switch op % 6 {
	case 0, 1: // a delivery arrives and looks at the ledger
		m.nextOwner++
		owner := fmt.Sprintf("o%d", m.nextOwner)
		before := m.row
		a := decide(m.row, m.now)
		switch a {
		case actClaim, actRetry, actTakeOver:
			m.row = claimed(m.row, a, owner, m.now, m.lease)
			m.running[owner] = m.row.leaseUntil
			m.runs++
			if m.row.attempts <= before.attempts && a != actClaim {
				t.Fatalf("%v did not raise attempts: %+v -> %+v", a, before, m.row)
			}
		case actDuplicate:
			if !m.row.done {
				t.Fatalf("duplicate on a row not done: %+v", m.row)
			}
		case actWait:
			if !m.now.Before(m.row.leaseUntil) || m.row.owner == "" {
				t.Fatalf("wait without a live lease: %+v at %v", m.row, m.now)
			}
		}
	case 2: // a running owner finishes: mark done if it still owns the claim
		if owner, ok := m.pick(arg); ok {
			delete(m.running, owner)
			if ownedBy(m.row, owner) {
				m.row = completed(m.row)
				m.completes++
			}
		}
	case 3: // a running owner's handler fails: release if it owns the claim
		if owner, ok := m.pick(arg); ok {
			delete(m.running, owner)
			if ownedBy(m.row, owner) {
				m.row = released(m.row)
			}
		}
	case 4: // a running owner renews its lease, or learns it lost it
		if owner, ok := m.pick(arg); ok {
			if ownedBy(m.row, owner) {
				m.row.leaseUntil = m.now.Add(m.lease)
				m.running[owner] = m.row.leaseUntil
			} else {
				delete(m.running, owner) // its context is cancelled
			}
		}
	case 5: // time passes; a crashed owner is one that never acts again
		m.now = m.now.Add(time.Duration(arg) * m.lease / 64)
		if arg%7 == 0 {
			if owner, ok := m.pick(arg); ok {
				delete(m.running, owner)
			}
		}
	}
	m.check(t)
}

func (m *model) pick(arg byte) (string, bool) {
	if len(m.running) == 0 {
		return "", false
	}
	i := int(arg) % len(m.running)
	for o := range m.running {
		if i == 0 {
			return o, true
		}
		i--
	}
	return "", false
}

func (m *model) check(t *testing.T) {
	t.Helper()
	if m.completes > 1 {
		t.Fatalf("marked done %d times", m.completes)
	}
	if m.row.done != (m.completes == 1) {
		t.Fatalf("row done = %v after %d completions", m.row.done, m.completes)
	}
	if m.row.exists && m.row.attempts < 1 {
		t.Fatalf("attempts %d", m.row.attempts)
	}
	if m.row.exists && m.row.attempts != m.runs {
		// Every run took a claim, and every claim after the first raised
		// attempts: attempts counts the runs.
		t.Fatalf("attempts %d after %d runs", m.row.attempts, m.runs)
	}
	// At most one running owner is within the lease it took or renewed:
	// two deliveries never run the handler at once while leases are
	// renewed (a claim is taken over only once its lease has passed).
	live := 0
	for _, until := range m.running {
		if m.now.Before(until) {
			live++
		}
	}
	if live > 1 {
		t.Fatalf("%d owners with a live lease", live)
	}
	if m.row.done && m.row.owner != "" {
		t.Fatalf("done row keeps owner %q", m.row.owner)
	}
}

// FuzzClaim drives the claim state machine with arbitrary interleavings (ops
// is a list of (operation, argument) byte pairs) of
// deliveries, completions, failures, renewals, crashes and time, and checks
// that a message is marked done at most once, by its current owner, that
// no two owners hold a live lease, and that a done row is only ever a
// duplicate.
func FuzzClaim(f *testing.F) {
	f.Add([]byte{0, 0, 2, 0, 0, 0})
	f.Add([]byte{0, 0, 5, 200, 0, 0, 2, 0, 2, 1})
	f.Add([]byte{0, 0, 3, 0, 0, 0, 2, 0})
	f.Add([]byte{0, 0, 5, 70, 0, 0, 4, 0, 4, 1, 2, 0, 2, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		m := &model{now: time.Unix(1e6, 0), lease: time.Minute, running: map[string]time.Time{}}
		for i := 0; i+1 < len(ops); i += 2 {
			m.step(t, ops[i], ops[i+1])
		}
	})
}
