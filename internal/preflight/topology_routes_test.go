package preflight

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/brokerapi"
	"github.com/cdcrelay/cdcrelay/internal/config"
)

// testGraph is a vhost's topology for routeGraph's tests.
func testGraph() *routeGraph {
	q := func(dest, key string) binding {
		return binding{Destination: dest, DestinationType: "queue", RoutingKey: key}
	}
	x := func(dest, key string) binding {
		return binding{Destination: dest, DestinationType: "exchange", RoutingKey: key}
	}
	return &routeGraph{exchanges: map[string]*exchangeNode{
		"events":   {typ: "topic", bindings: []binding{q("orders", "orders.#"), x("audit", "audit.*"), x("empty", "void.#")}},
		"audit":    {typ: "fanout", bindings: []binding{q("audit-log", "")}},
		"empty":    {typ: "topic"},
		"direct":   {typ: "direct", bindings: []binding{q("exact", "orders.created")}},
		"with-ae":  {typ: "topic", bindings: []binding{q("orders", "orders.*")}, alternate: "unrouted", alternateFrom: `policy "ae"`},
		"unrouted": {typ: "fanout", bindings: []binding{q("unrouted", "")}},
		"ae-chain": {typ: "direct", alternate: "ae-void", alternateFrom: "argument alternate-exchange"},
		"ae-void":  {typ: "topic", alternate: "ae-gone", alternateFrom: "argument alternate-exchange"},
		"ae-gone":  {missing: true},
		"headers":  {typ: "headers", bindings: []binding{q("h", "")}},
		"loop-a":   {typ: "fanout", bindings: []binding{x("loop-b", "")}},
		"loop-b":   {typ: "fanout", bindings: []binding{x("loop-a", "")}},
		"to-far":   {typ: "fanout", bindings: []binding{x("far", "")}},
	}}
}

// TestRouteGraphRoute: direct, topic and fanout exchanges route by their
// type; exchange-to-exchange bindings are followed; an exchange that
// picks no binding hands the message to its alternate exchange, and one
// whose own binding matched (even towards an exchange that routes
// nowhere) does not; an alternate exchange that routes nowhere, or does
// not exist, routes nothing; a headers exchange, or an exchange past the
// graph, cannot be told; a loop ends.
func TestRouteGraphRoute(t *testing.T) {
	g := testGraph()
	for _, c := range []struct {
		exchange, key string
		routed        bool
		unknown       string // a fragment; "" when the verdict is certain
	}{
		{"events", "orders.created", true, ""},
		{"events", "audit.login", true, ""},            // through the fanout exchange
		{"events", "void.x", false, ""},                // to an exchange with no binding
		{"events", "payments.created", false, ""},      // no binding matches
		{"direct", "orders.created", true, ""},         // exact
		{"direct", "orders.created.eu", false, ""},     // direct is not a pattern
		{"with-ae", "orders.created", true, ""},        // its binding
		{"with-ae", "payments.created", true, ""},      // its alternate exchange
		{"ae-chain", "anything", false, ""},            // alternate exchanges that lead nowhere
		{"headers", "anything", false, "type headers"}, // routes on more than the key
		{"loop-a", "k", false, ""},
		{"to-far", "k", false, "past the"},
		{"nosuch", "k", false, "past the"},
	} {
		v := g.route(c.exchange, c.key)
		if v.routed != c.routed || (c.unknown == "") != (v.unknown == "") || !strings.Contains(v.unknown, c.unknown) {
			t.Errorf("route(%q, %q) = %+v; want routed %v, unknown with %q", c.exchange, c.key, v, c.routed, c.unknown)
		}
	}

	for _, c := range []struct {
		from string
		want string
	}{
		{"events", "audit-log orders"},
		{"with-ae", "orders unrouted"},
		{"ae-chain", ""},
		{"loop-a", ""},
	} {
		qs, _ := g.queues(c.from, 10)
		if got := strings.Join(qs, " "); got != c.want {
			t.Errorf("queues(%q) = %q, want %q", c.from, got, c.want)
		}
	}
	if qs, truncated := g.queues("events", 1); len(qs) != 1 || !truncated {
		t.Errorf("queues(events, 1) = %q, %v; want one queue, truncated", qs, truncated)
	}
}

// TestCheckExchangeRoutes: an exchange that reaches no queue is an Error
// (a warning with park: every row would be parked) whose message says why
// (no binding and no alternate exchange; an alternate exchange that itself
// routes nowhere, or does not exist) and whose remedy binds a queue or
// sets an alternate exchange; one that reaches queues only through its
// alternate exchange is OK.
func TestCheckExchangeRoutes(t *testing.T) {
	g := testGraph()
	g.exchanges["bare"] = &exchangeNode{typ: "topic"}
	judge := func(exchange, unroutable string) (Finding, bool) {
		qs, _ := g.queues(exchange, maxBoundQueues)
		return checkExchangeRoutes(g, "prod", exchange, unroutable, qs)
	}
	f, ok := judge("bare", config.UnroutableStall)
	if !ok || f.Severity != Error || !strings.Contains(f.Message, `exchange "bare" (CDCRELAY_EXCHANGE) has no binding and no alternate exchange`) ||
		!strings.Contains(f.Message, "the stream stops on it") {
		t.Errorf("no binding: %v %q", f.Severity, f.Message)
	}
	for _, want := range []string{"rabbitmqadmin -V prod declare binding source=bare destination=<queue>", `rabbitmqctl set_policy -p prod --apply-to exchanges bare-ae '^bare$' '{"alternate-exchange":"<exchange>"}'`} {
		if !strings.Contains(f.Remedy, want) {
			t.Errorf("no binding: remedy %q lacks %q", f.Remedy, want)
		}
	}
	if f, ok := judge("bare", config.UnroutablePark); !ok || f.Severity != Warn || !strings.Contains(f.Message, "every row would be parked") {
		t.Errorf("no binding, park: %v %q", f.Severity, f.Message)
	}
	if f, ok := judge("ae-chain", config.UnroutableStall); !ok || f.Severity != Error ||
		!strings.Contains(f.Message, `has no binding, and its alternate exchange "ae-void" (argument alternate-exchange) reaches no queue either`) {
		t.Errorf("an alternate exchange that routes nowhere: %v %q", f.Severity, f.Message)
	}
	g.exchanges["ae-missing"] = &exchangeNode{typ: "topic", alternate: "ae-gone", alternateFrom: `policy "p"`}
	if f, ok := judge("ae-missing", config.UnroutableStall); !ok || f.Severity != Error || !strings.Contains(f.Message, `its alternate exchange "ae-gone" (policy "p") does not exist`) {
		t.Errorf("a missing alternate exchange: %v %q", f.Severity, f.Message)
	}
	g.exchanges["only-ae"] = &exchangeNode{typ: "topic", alternate: "unrouted", alternateFrom: `policy "ae"`}
	if f, ok := judge("only-ae", config.UnroutableStall); !ok || f.Severity != OK || !strings.Contains(f.Message, `its alternate exchange "unrouted" (policy "ae") takes every message and reaches 1 queue(s)`) {
		t.Errorf("an alternate exchange with a queue: %v %q", f.Severity, f.Message)
	}
	if _, ok := judge("events", config.UnroutableStall); ok {
		t.Errorf("an exchange with bindings to queues has a finding of its own")
	}
}

// TestJudgeKey: a key no binding routes is an Error naming the key, its
// exchange and how many rows carry it (a warning with park); a routed key
// has no finding; an exchange the rows name that does not exist is an
// Error; a headers exchange is not checked.
func TestJudgeKey(t *testing.T) {
	g := testGraph()
	k := recentKey{key: "payments.created", rows: 3, unpublished: 2}
	f, ok := judgeKey(g, "prod", "events", k, 1000, config.UnroutableStall)
	if ok || f.Severity != Error || !strings.Contains(f.Message, `no binding routes routing key "payments.created" on exchange "events" to a queue, and 3 of the 1000 rows read (2 of them unpublished) carry it`) ||
		!strings.Contains(f.Remedy, "rabbitmqadmin -V prod declare binding source=events destination=<queue> routing_key='payments.created'") {
		t.Errorf("unbound key: %v %q remedy %q", f.Severity, f.Message, f.Remedy)
	}
	if f, ok := judgeKey(g, "prod", "events", k, 1000, config.UnroutablePark); ok || f.Severity != Warn || !strings.Contains(f.Message, "parked") {
		t.Errorf("unbound key, park: %v %q", f.Severity, f.Message)
	}
	if _, ok := judgeKey(g, "prod", "events", recentKey{key: "orders.created", rows: 1}, 1, config.UnroutableStall); !ok {
		t.Errorf("a bound key is not routed")
	}
	if f, ok := judgeKey(g, "prod", "ae-gone", k, 1000, config.UnroutableStall); ok || f.Severity != Error || !strings.Contains(f.Message, `exchange "ae-gone", named by the exchange column of 3 of the 1000 rows read`) {
		t.Errorf("a missing row exchange: %v %q", f.Severity, f.Message)
	}
	if f, ok := judgeKey(g, "prod", "headers", k, 1000, config.UnroutableStall); ok || f.Severity != OK || !strings.Contains(f.Message, "not checked") {
		t.Errorf("a headers exchange: %v %q", f.Severity, f.Message)
	}
}

// TestTopologyChecksUnboundExchange: through a fake management API, an
// exchange with no binding is an Error, unless an alternate exchange set
// by a policy (which the API names, and the policy list defines) reaches
// a queue.
func TestTopologyChecksUnboundExchange(t *testing.T) {
	answers := map[string]any{
		"/api/whoami":                                  map[string]any{"name": "monitor", "tags": []string{"monitoring"}},
		"/api/exchanges/prod/events2":                  exchangeInfo{Name: "events2", Type: "topic"},
		"/api/exchanges/prod/events2/bindings/source":  []binding{},
		"/api/exchanges/prod/unrouted":                 exchangeInfo{Name: "unrouted", Type: "fanout"},
		"/api/exchanges/prod/unrouted/bindings/source": []binding{{Destination: "unrouted", DestinationType: "queue"}},
		"/api/queues/prod/unrouted":                    queueInfo{Name: "unrouted", Durable: true},
		"/api/policies/prod":                           []brokerapi.Policy{{Name: "ae", Pattern: "^events2$", ApplyTo: "exchanges", Definition: map[string]any{"alternate-exchange": "unrouted"}}},
	}
	srv := fakeManagement(t, "", answers)
	cfg := config.Config{AMQPURL: "amqp://relay:pw@127.0.0.1:5672/prod", Exchange: "events2", Unroutable: config.UnroutableStall}
	opts := Options{Timeout: 5 * time.Second}

	fs := topologyChecks(context.Background(), cfg, srv.URL, opts)
	if len(fs) != 1 || fs[0].Severity != Error || !strings.Contains(fs[0].Message, `exchange "events2" (CDCRELAY_EXCHANGE) has no binding and no alternate exchange`) {
		t.Fatalf("an exchange with no binding: %+v", fs)
	}

	answers["/api/exchanges/prod/events2"] = exchangeInfo{Name: "events2", Type: "topic", Policy: "ae"}
	fs = topologyChecks(context.Background(), cfg, srv.URL, opts)
	if countSeverity(fs, Error)+countSeverity(fs, Warn) != 0 || !hasFinding(fs, OK, `its alternate exchange "unrouted" (policy "ae") takes every message`) {
		t.Fatalf("an alternate exchange with a queue: %+v", fs)
	}
}
