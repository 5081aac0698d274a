package preflight

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationBrokerChecksEveryNode: with several nodes in
// CDCRELAY_AMQP_URL, check connects to each and reports each by its
// address: the live node connected with its exchange found, the dead one a
// warning while another node works (the relay skips it) and an error when
// none does; no output shows the password.
func TestIntegrationBrokerChecksEveryNode(t *testing.T) {
	live := testenv.RequireAMQP(t)
	ctx := context.Background()
	exchange := testenv.UniqueName("cdcrelay.preflight.nodes")
	if err := testenv.DeclareExchange(ctx, live, exchange); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.DeleteExchange(context.Background(), live, exchange) })
	u, err := url.Parse(live)
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	dead := closedPort(t)
	multi := fmt.Sprintf("amqp://%s@%s,%s%s", u.User.String(), dead, u.Host, u.EscapedPath())
	cfg := config.Config{AMQPURL: multi, Exchange: exchange}

	fs := scrub(brokerChecks(ctx, cfg, Options{Timeout: 5 * time.Second}), cfg.Scrub)
	var b bytes.Buffer
	if n := Write(&b, fs); n != 0 {
		t.Fatalf("%d errors with one node of two live:\n%s", n, b.String())
	}
	out := b.String()
	for _, want := range []string{
		"WARN   broker", "node 1 of 2 (" + dead + "): cannot connect to amqp://", "the relay connects to the other nodes",
		"OK     broker", "node 2 of 2 (" + u.Host + "): connected to amqp://",
		"OK     exchange", "node 2 of 2 (" + u.Host + "): exchange \"" + exchange + "\" exists",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if len(pw) >= 4 && strings.Contains(out, pw) {
		t.Errorf("output shows the password:\n%s", out)
	}

	const secret = "Nodes-S3cret"
	cfg = config.Config{AMQPURL: fmt.Sprintf("amqp://relay:%s@%s,%s/", secret, dead, closedPort(t)), Exchange: exchange}
	fs = scrub(brokerChecks(ctx, cfg, Options{Timeout: 5 * time.Second}), cfg.Scrub)
	b.Reset()
	if n := Write(&b, fs); n != 2 || strings.Contains(b.String(), secret) || !strings.Contains(b.String(), "node 2 of 2 (") {
		t.Fatalf("no node live: want 2 errors naming each node, no password:\n%s", b.String())
	}
}

// closedPort is a 127.0.0.1 address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}
