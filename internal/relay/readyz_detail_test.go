package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationStatusSaysWhyItRetries: a relay whose exchange is missing keeps
// retrying; its status (the body of /readyz) names the exchange instead of a
// bare "starting", and drops the error once the exchange exists and the relay
// streams.
func TestIntegrationStatusSaysWhyItRetries(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	missing := testenv.UniqueName("cdcrelay.missing")
	r := e.startRelay(map[string]string{"EXCHANGE": missing})
	var status string
	r.WaitFor(t, 30*time.Second, "a status naming the missing exchange", func() bool {
		status = r.relay.Status()
		return strings.HasPrefix(status, "starting: retrying after: ") && strings.Contains(status, missing)
	})
	t.Logf("status while retrying: %s", status)
	if strings.Contains(status, relayRolePassword) || strings.Contains(status, "\n") || len([]rune(status)) > 250 {
		t.Errorf("status %q: a password, a newline, or longer than the clip", status)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := testenv.DeclareExchange(ctx, e.amqpURL, missing); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.DeleteExchange(context.Background(), e.amqpURL, missing) })
	r.waitStreaming(t)
	if got := r.relay.Status(); got != "streaming" {
		t.Errorf("status while streaming: %q, want %q", got, "streaming")
	}
}
