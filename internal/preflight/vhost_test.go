package preflight

import (
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationMissingVhost: the real broker's refusal of a vhost that
// does not exist gets a remedy about the vhost, not a set_permissions on
// it (which would fail the same way); a refused user keeps that one.
func TestIntegrationMissingVhost(t *testing.T) {
	base := testenv.RequireAMQP(t)
	vhost := testenv.UniqueName("cdcrelay-no-such-vhost")
	node := strings.TrimSuffix(base, "/") + "/" + vhost
	uri, err := amqp.ParseURI(node)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(node)
	if err == nil {
		_ = conn.Close()
		t.Fatalf("the broker accepted vhost %s", vhost)
	}
	f := brokerDialFailed("the broker", uri, err)
	if f.Severity != Error || !strings.Contains(f.Remedy, `vhost "`+vhost+`" does not exist`) ||
		!strings.Contains(f.Remedy, "rabbitmqctl add_vhost "+vhost) || strings.Contains(f.Remedy, "set_permissions") {
		t.Errorf("missing vhost (broker said %v): %+v", err, f)
	}
	refused := &amqp.Error{Code: amqp.NotAllowed, Reason: "NOT_ALLOWED - access to vhost '" + vhost + "' refused for user 'guest'"}
	if f := brokerDialFailed("the broker", uri, errors.Join(refused)); !strings.Contains(f.Remedy, "set_permissions -p "+vhost) {
		t.Errorf("refused user: %+v", f)
	}
}
