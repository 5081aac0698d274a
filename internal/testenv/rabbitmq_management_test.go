package testenv

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestIntegrationRabbitMQManagement starts a private node with the
// management plugin and reads the node's own name from its HTTP API, so
// the API answering is this node's and not the shared broker's.
func TestIntegrationRabbitMQManagement(t *testing.T) {
	t.Parallel()
	m := MustRabbitMQManagement(t, RabbitMQOptions{Config: map[string]string{"max_message_size": "1048576"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.Replace(m.ManagementURL(), "guest:guest@", "", 1)+"/api/overview", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("guest", "guest")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"node":"`+m.Node()+`"`) {
		t.Fatalf("GET /api/overview: %s, body without node %s:\n%s", resp.Status, m.Node(), Tail(string(body), 5))
	}
	if out, err := m.Ctl(ctx, "environment"); err != nil || !strings.Contains(out, "{max_message_size,1048576}") {
		t.Fatalf("the node's own settings are not kept beside the management listener: %v\n%s", err, Tail(out, 5))
	}
}
