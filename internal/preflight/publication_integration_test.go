package preflight_test

import (
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/preflight"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationCheckPublicationTypo: CDCRELAY_PUBLICATION names a
// publication that does not exist while another publishes the table (a
// typo, or a copied value): check names the one that does.
func TestIntegrationCheckPublicationTypo(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	fs, _ := newFixture(t, pg, amqpURL, `ALTER PUBLICATION cdcrelay_outbox RENAME TO cdcrelay_orders`).check(map[string]string{"PUBLICATION": "cdcrelay_typo"})
	has(t, fs, "publication", preflight.Error, "publication cdcrelay_typo does not exist")
	has(t, fs, "publication", preflight.Error, "public.event_outbox is published by cdcrelay_orders (did you mean CDCRELAY_PUBLICATION=cdcrelay_orders?)")
	has(t, fs, "publication", preflight.Error, "remedy:if cdcrelay_orders is the relay's, set CDCRELAY_PUBLICATION=cdcrelay_orders; otherwise run `cdcrelay migrate`")
}
