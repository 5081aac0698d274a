package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/svckit/brokernode"
)

// streamDeleteTimeout bounds deleting a test's stream at its cleanup.
const streamDeleteTimeout = 10 * time.Second

// MustStream declares a durable stream queue (x-queue-type stream, RabbitMQ
// 3.9+) bound to exchange with bindingKey, and deletes it, with everything
// it holds, when the test ends. The exchange must exist. A stream is an
// append-only log: what a test reads from it with ReadStream stays, so the
// test sees every copy the broker took, duplicates included, in the order
// it appended them.
func MustStream(tb testing.TB, url, exchange, queue, bindingKey string) {
	tb.Helper()
	RequireIntegration(tb, "RabbitMQ")
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	err := brokernode.DeclareStream(ctx, url, exchange, queue, bindingKey)
	// Registered before the check: a declare that worked and a bind that
	// failed still leave a stream to delete.
	tb.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), streamDeleteTimeout)
		defer ccancel()
		if err := DeleteQueue(cctx, url, queue); err != nil {
			tb.Logf("delete stream: %v", err)
		}
	})
	if err != nil {
		tb.Fatal(err)
	}
}
