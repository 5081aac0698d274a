package preflight

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

func TestOverflowFinding(t *testing.T) {
	for _, c := range []struct {
		name     string
		q        queueInfo
		limited  bool
		sev      Severity
		fragment string
	}{
		{"no limit", queueInfo{Arguments: map[string]any{"x-queue-type": "classic"}}, false, OK, ""},
		{"stream retention by size", queueInfo{Type: "stream", Durable: true, Arguments: map[string]any{"x-max-length-bytes": 1e9}}, true, Warn, "retention x-max-length-bytes=1000000000 (argument): the broker acks every publish and discards the oldest segments"},
		{"stream retention by age, no reject-publish remedy", queueInfo{Type: "stream", Durable: true, Arguments: map[string]any{"x-max-age": "7D"}}, true, Warn, "x-max-age=7D (argument)"},
		{"stream without retention", queueInfo{Type: "stream", Durable: true}, false, OK, ""},
		{"argument limit, default overflow", queueInfo{Arguments: map[string]any{"x-max-length": 10.0}}, true, Warn, "x-max-length=10 (argument) and overflow drop-head (the default)"},
		{"bytes limit from a policy", queueInfo{Policy: "cap", EffectivePolicyDefinition: map[string]any{"max-length-bytes": 1048576.0}}, true, Warn, `max-length-bytes=1048576 (policy "cap") and overflow drop-head`},
		{"explicit drop-head", queueInfo{Arguments: map[string]any{"x-max-length": 1.0, "x-overflow": "drop-head"}}, true, Warn, "overflow drop-head (argument x-overflow)"},
		{"reject-publish argument", queueInfo{Arguments: map[string]any{"x-max-length": 10.0, "x-overflow": "reject-publish"}}, true, OK, "without loss"},
		{"reject-publish from the policy", queueInfo{Policy: "p", EffectivePolicyDefinition: map[string]any{"max-length": 5.0, "overflow": "reject-publish"}}, true, OK, `reject-publish (policy "p")`},
		{"argument wins over the policy", queueInfo{Policy: "p", Arguments: map[string]any{"x-max-length": 5.0, "x-overflow": "drop-head"},
			EffectivePolicyDefinition: map[string]any{"overflow": "reject-publish"}}, true, Warn, "drop-head (argument x-overflow)"},
		{"reject-publish-dlx", queueInfo{Arguments: map[string]any{"x-max-length-bytes": 100.0, "x-overflow": "reject-publish-dlx"}}, true, OK, "dead-letter exchange"},
		{"overflow without a limit", queueInfo{Arguments: map[string]any{"x-overflow": "drop-head"}}, false, OK, ""},
		// A quorum queue overshoots its limit by what is in flight: the
		// finding names the relay's window, from its configuration.
		{"quorum, reject-publish argument", queueInfo{Type: "quorum", Arguments: map[string]any{"x-queue-type": "quorum", "x-max-length": 2.0, "x-overflow": "reject-publish"}}, true, Warn,
			"and overflow reject-publish (argument x-overflow), but a quorum queue refuses only once it is over its limit and takes what was already published: it can hold up to the relay's in-flight window past the limit (CDCRELAY_MAX_IN_FLIGHT=500, shared by CDCRELAY_PUBLISH_CHANNELS=2). Nothing is lost"},
		{"quorum, reject-publish from the policy", queueInfo{Type: "quorum", Policy: "p", EffectivePolicyDefinition: map[string]any{"max-length-bytes": 1e6, "overflow": "reject-publish"}}, true, Warn, "not a hard bound"},
		{"quorum told by its argument", queueInfo{Arguments: map[string]any{"x-queue-type": "quorum", "x-max-length": 2.0, "x-overflow": "reject-publish"}}, true, Warn, "a quorum queue refuses only once"},
		{"quorum, drop-head", queueInfo{Type: "quorum", Arguments: map[string]any{"x-max-length": 2.0}}, true, Warn, "overflow drop-head (the default): when it is full the broker acks"},
		{"quorum, reject-publish-dlx drops", queueInfo{Type: "quorum", Policy: "p", EffectivePolicyDefinition: map[string]any{"max-length": 2.0, "overflow": "reject-publish-dlx"}}, true, Warn,
			`overflow reject-publish-dlx, which a quorum queue does not support (policy "p"): when it is full the broker acks the relay's publish and silently drops the oldest message`},
		{"quorum without a limit", queueInfo{Type: "quorum", Arguments: map[string]any{"x-queue-type": "quorum", "x-overflow": "reject-publish"}}, false, OK, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.q.Name = "orders"
			f, limited := overflowFinding("/", "events", c.q, inFlight{messages: 500, channels: 2})
			if limited != c.limited {
				t.Fatalf("limited = %v, want %v (%+v)", limited, c.limited, f)
			}
			if !limited {
				return
			}
			if f.Severity != c.sev || !strings.Contains(f.Message, c.fragment) {
				t.Fatalf("%v %q; want %v with %q", f.Severity, f.Message, c.sev, c.fragment)
			}
			if c.q.Type == "stream" {
				// A stream has no overflow setting to change.
				if strings.Contains(f.Remedy, "reject-publish") || !strings.Contains(f.Remedy, "retention") {
					t.Fatalf("stream remedy %q: want retention sizing, not reject-publish", f.Remedy)
				}
				return
			}
			if f.Severity == Warn && !strings.Contains(f.Remedy, "reject-publish") {
				t.Fatalf("remedy %q does not name reject-publish", f.Remedy)
			}
			// A quorum queue's overshoot is told once, with the window.
			n := strings.Count(f.Message+f.Remedy, "in-flight window past the limit (CDCRELAY_MAX_IN_FLIGHT=500, shared by CDCRELAY_PUBLISH_CHANNELS=2)")
			if quorum := isQuorum(c.q); quorum != (n == 1) || n > 1 {
				t.Fatalf("quorum %v, the window named %d times: %q remedy %q", quorum, n, f.Message, f.Remedy)
			}
			if isQuorum(c.q) && !strings.Contains(f.Remedy, "classic queue") {
				t.Fatalf("remedy %q does not offer a classic queue", f.Remedy)
			}
		})
	}
}

// TestTopologyChecksFakeAPI walks a fake management API: a queue reached
// through an exchange-to-exchange binding is judged, a DLX without a
// binding is reported, the vhost "/" is escaped, and no finding shows the
// management password, even when the API refuses it.
func TestTopologyChecksFakeAPI(t *testing.T) {
	const password = "Mgmt-Fake-Secret-3c1"
	answers := map[string]any{
		"/api/whoami":                               map[string]any{"name": "monitor"},
		"/api/exchanges/%2F/events":                 exchangeInfo{Name: "events", Type: "topic"},
		"/api/exchanges/%2F/fanout":                 exchangeInfo{Name: "fanout", Type: "fanout"},
		"/api/exchanges/%2F/events/bindings/source": []binding{{Destination: "fanout", DestinationType: "exchange"}, {Destination: "plain", DestinationType: "queue"}},
		"/api/exchanges/%2F/fanout/bindings/source": []binding{{Destination: "capped", DestinationType: "queue"}, {Destination: "events", DestinationType: "exchange"}},
		"/api/exchanges/%2F/dlx/bindings/source":    []binding{},
		"/api/exchanges/%2F/dlx":                    exchangeInfo{Name: "dlx", Type: "topic"},
		"/api/queues/%2F/plain":                     queueInfo{Name: "plain", Durable: true},
		"/api/queues/%2F/capped":                    queueInfo{Name: "capped", Durable: true, Arguments: map[string]any{"x-max-length": 3.0}},
	}
	srv := fakeManagement(t, password, answers)
	cfg := config.Config{AMQPURL: "amqp://relay:amqp-pw@127.0.0.1:5672/", Exchange: "events", DeadLetterExchange: "dlx"}
	opts := Options{Timeout: 5 * time.Second}
	mgmt := strings.Replace(srv.URL, "http://", "http://monitor:"+password+"@", 1)

	fs := topologyChecks(context.Background(), cfg, mgmt, opts)
	var warned []string
	for _, f := range fs {
		if strings.Contains(f.Message+f.Remedy, password) {
			t.Fatalf("finding shows the password: %+v", f)
		}
		if f.Severity == Warn {
			warned = append(warned, f.Message)
		}
	}
	if len(warned) != 2 || !strings.Contains(warned[0], `dead-letter exchange "dlx"`) || !strings.Contains(warned[1], `queue "capped"`) {
		t.Fatalf("warnings %q; want the DLX's missing binding, then queue capped", warned)
	}

	fs = topologyChecks(context.Background(), cfg, strings.Replace(mgmt, password, password+"x", 1), opts)
	if len(fs) != 1 || fs[0].Severity != Warn || !strings.Contains(fs[0].Message, "401") {
		t.Fatalf("a refused login: %+v", fs)
	}
	for _, f := range fs {
		if strings.Contains(f.Message+f.Remedy, password) {
			t.Fatalf("finding shows the password: %+v", f)
		}
	}

	fs = topologyChecks(context.Background(), cfg, "", opts)
	if len(fs) != 1 || fs[0].Severity != OK || !strings.Contains(fs[0].Message, "were not checked") || !strings.Contains(fs[0].Message, managementURLVariable) {
		t.Fatalf("without a management URL: %+v", fs)
	}
}

// fakeManagement serves answers, by escaped path, as a management API
// would: 404 for any other path, 401 when password is set and the request
// does not carry it. It is closed when the test ends.
func fakeManagement(t *testing.T, password string, answers map[string]any) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pw, _ := r.BasicAuth(); password != "" && pw != password {
			http.Error(w, `{"error":"not_authorised","reason":"Login failed"}`, http.StatusUnauthorized)
			return
		}
		a, ok := answers[r.URL.EscapedPath()]
		if !ok {
			http.Error(w, `{"error":"Object Not Found"}`, http.StatusNotFound)
			return
		}
		_ = json.NewEncoder(w).Encode(a)
	}))
	t.Cleanup(srv.Close)
	return srv
}
