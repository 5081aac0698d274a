package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

var builds testenv.Builds

// TestMain makes the test binary the demo's consumer when the demo starts
// it as one, as the command's main does.
func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "consumer" {
		os.Exit(consume())
	}
	builds.Main(m)
}

// TestIntegrationInboxDemo runs the demo's core, what `make demo-inbox`
// runs: the relay feeds a consumer on package inbox that is killed after an
// effect and before its ack, and every committed event must be applied
// exactly once, with the redelivered copy absorbed as a duplicate.
func TestIntegrationInboxDemo(t *testing.T) {
	relay := builds.Relay(t, false, "")
	testenv.RequireAMQP(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const events = 60
	sum, err := demo(ctx, options{relay: relay, consumer: self, events: events, rate: 50, dieAfter: 20})
	if err != nil {
		t.Fatalf("demo: %v (%+v)", err, sum)
	}
	if !sum.killed || sum.committed != events || sum.applied != events || sum.distinct != events || sum.duplicates < 1 {
		t.Errorf("demo summary %+v: want the consumer killed, %d events committed and applied once each, at least one duplicate absorbed", sum, events)
	}
}

func TestSummaryCheck(t *testing.T) {
	for _, c := range []struct {
		s  summary
		ok bool
	}{
		{summary{committed: 5, applied: 5, distinct: 5, duplicates: 1, killed: true}, true},
		{summary{committed: 5, applied: 6, distinct: 5, killed: true}, false}, // an effect applied twice
		{summary{committed: 5, applied: 4, distinct: 4, killed: true}, false}, // an event lost
		{summary{committed: 5, applied: 5, distinct: 5}, false},               // nothing was killed
	} {
		if err := c.s.check(); (err == nil) != c.ok {
			t.Errorf("%+v: check = %v, want ok %v", c.s, err, c.ok)
		}
	}
}
