package main

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationFatalExitLoggedAtError: a relay configured for a table the
// publication does not publish (a misspelt CDCRELAY_TABLE) exits 1, and the
// exit is logged at ERROR with the cause first, where the runbook's first
// filter looks, and only once.
func TestIntegrationFatalExitLoggedAtError(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg, _ := migratedPostgres(ctx, t)
	exchange := testenv.UniqueName("cdcrelay.fatal")
	if err := testenv.DeclareExchange(ctx, amqpURL, exchange); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.DeleteExchange(context.Background(), amqpURL, exchange) })

	relay := testenv.StartProcess(t, builds.Relay(t, true, ""), relayEnviron(pg, amqpURL, exchange, "CDCRELAY_TABLE=public.event_outbx"), "run")
	err := relay.Wait(t, 30*time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1", err)
	}
	out := relay.Log.String()
	line, ok := lineWith(out, "level=ERROR")
	if !ok || !strings.Contains(line, `msg="fatal: `) || !strings.Contains(line, "event_outbx") {
		t.Fatalf("the first ERROR line is not the fatal cause naming the table:\n%s", out)
	}
	if _, again := lineWith(out, "cdcrelay: "); again {
		t.Errorf("the fatal error is printed again outside the log:\n%s", out)
	}
	t.Logf("the relay's output:\n%s", out)
	if strings.Contains(out, "level=INFO msg=exiting") {
		t.Errorf("a fatal exit logged as a clean one:\n%s", out)
	}
}
