package relay_test

import (
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationModelReturnOnIdleOutboxRetriesWithChannels: with several
// publish channels, a returned message on an otherwise idle outbox must
// still end the session, so the relay retries and delivers the event once
// a queue is bound for its key. Before the fix the publisher waited for the
// next outbox row before giving up its failed session, so nothing was
// retried on an idle outbox (found by the publish package's model test).
func TestIntegrationModelReturnOnIdleOutboxRetriesWithChannels(t *testing.T) {
	e := newEnv(t, testenv.PostgresOptions{}, "routed.#")
	r := e.startRelay(map[string]string{"PUBLISH_CHANNELS": "3"})
	r.waitStreaming(t)
	unrouted, last := insertTxns(t, e.db, "nowhere", 1)
	time.Sleep(time.Second) // the first attempt is returned; nothing else is written
	waitReturnedUntilRouted(t, e, unrouted, last)
}
