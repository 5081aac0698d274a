package publish

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// deadNode is the URL of a port nothing listens on, with the shared
// broker's credentials.
func deadNode(t *testing.T, password string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("amqp://guest:%s@%s/", password, addr)
}

// TestIntegrationDialNodes: Dial skips a node that refuses the connection,
// reports the node it connected to (host:port, no credentials) and its
// place in the list; when no node answers, the error names every node and
// no password.
func TestIntegrationDialNodes(t *testing.T) {
	live := testenv.RequireAMQP(t)
	uri, err := amqp.ParseURI(live)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead := deadNode(t, uri.Password)

	l, err := Dial(ctx, DialOptions{URLs: []string{dead, live}, Name: "cdcrelay nodes test", Window: 10})
	if err != nil {
		t.Fatalf("Dial with a dead node first: %v", err)
	}
	defer func() { _ = l.Close() }()
	if want := net.JoinHostPort(uri.Host, fmt.Sprint(uri.Port)); l.Node() != want || l.NodeIndex() != 1 {
		t.Fatalf("connected to %q (index %d), want %q (index 1)", l.Node(), l.NodeIndex(), want)
	}

	const secret = "Dial-n0des-pw"
	deadA, deadB := deadNode(t, secret), deadNode(t, secret)
	_, err = Dial(ctx, DialOptions{URLs: []string{deadA, deadB}, Name: "cdcrelay nodes test"})
	if err == nil {
		t.Fatal("Dial to two dead nodes succeeded")
	}
	msg := err.Error()
	for _, u := range []string{deadA, deadB} {
		addr := strings.TrimSuffix(strings.TrimPrefix(u, "amqp://guest:"+secret+"@"), "/")
		if !strings.Contains(msg, "broker node "+addr+": ") {
			t.Errorf("error does not name node %s: %s", addr, msg)
		}
	}
	if strings.Contains(msg, secret) || strings.Contains(msg, "\n") {
		t.Errorf("error shows the password or spans lines: %q", msg)
	}
	var opErr *net.OpError
	if !errors.As(err, &opErr) {
		t.Errorf("error does not wrap the dial errors: %v", err)
	}

	// A URL the library cannot read is named by its place, not quoted.
	_, err = Dial(ctx, DialOptions{URLs: []string{"amqp://guest:" + secret + "@h1:port/", deadA}})
	if err == nil || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "broker node 1 of 2: not a valid AMQP URL") {
		t.Errorf("Dial with an unreadable URL: %v", err)
	}
}

// TestIntegrationDialNodesMissingExchange: a missing exchange is the same on
// every node of a cluster, so Dial stops at the first node that says so.
func TestIntegrationDialNodesMissingExchange(t *testing.T) {
	live := testenv.RequireAMQP(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	missing := testenv.UniqueName("cdcrelay.nodes.missing")
	_, err := Dial(ctx, DialOptions{URLs: []string{live, live}, Exchanges: []string{missing}})
	if !errors.Is(err, ErrNoExchange) || strings.Count(err.Error(), "broker node ") != 1 {
		t.Fatalf("Dial with a missing exchange on two nodes: %v; want ErrNoExchange from the first node only", err)
	}
}
