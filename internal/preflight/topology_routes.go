package preflight

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/cdcrelay/cdcrelay/internal/brokerapi"
)

// This file reads where the relay's exchanges route (bindings,
// exchange-to-exchange bindings, alternate exchanges) into a routeGraph,
// and judges a routing key against it the way RabbitMQ routes a message.
// The relay publishes every message mandatory: one that reaches no queue
// is returned and, with CDCRELAY_UNROUTABLE=stall, stops the stream.

// exchangeNode is one exchange of the graph as the management API shows it.
type exchangeNode struct {
	typ string
	// alternate is the alternate exchange ("" for none): the argument, else
	// the policy's, as RabbitMQ looks them up. from says which.
	alternate, alternateFrom string
	bindings                 []binding
	missing                  bool // the exchange does not exist
}

// routeGraph is the exchanges reachable from the ones it was extended with.
type routeGraph struct {
	exchanges map[string]*exchangeNode
	// truncated: more than maxExchangeHops exchanges were reachable; the
	// others are not in exchanges.
	truncated bool
	// policies are the vhost's, read once when an exchange names one.
	policies     []brokerapi.Policy
	policiesRead bool
}

func newRouteGraph() *routeGraph { return &routeGraph{exchanges: map[string]*exchangeNode{}} }

// extendRouteGraph reads into g every exchange reachable from starts
// through exchange-to-exchange bindings and alternate exchanges, up to
// maxExchangeHops exchanges in all. The API shows an exchange's policy by
// name only, and a monitoring user may list a vhost's policies but not
// read one by name: the list is read once, when an exchange names a
// policy. An exchange that does not exist is kept as missing.
func (a *managementAPI) extendRouteGraph(ctx context.Context, g *routeGraph, vhost string, starts ...string) error {
	todo := slices.Clone(starts)
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		if _, seen := g.exchanges[name]; seen {
			continue
		}
		if len(g.exchanges) == maxExchangeHops {
			g.truncated = true
			return nil
		}
		n := &exchangeNode{}
		ex, err := a.Exchange(ctx, vhost, name)
		if err == nil {
			n.bindings, err = a.Bindings(ctx, vhost, name)
		}
		if errors.Is(err, errNotFound) {
			n.missing = true
			g.exchanges[name] = n
			continue
		}
		if err != nil {
			return err
		}
		n.typ = ex.Type
		if ae, _ := ex.Arguments["alternate-exchange"].(string); ae != "" {
			n.alternate, n.alternateFrom = ae, "argument alternate-exchange"
		} else if ex.Policy != "" {
			if !g.policiesRead {
				if g.policies, err = a.Policies(ctx, vhost); err != nil {
					return fmt.Errorf("read the policies of vhost %q (exchange %q has policy %q): %w", vhost, name, ex.Policy, err)
				}
				g.policiesRead = true
			}
			n.alternate, n.alternateFrom = policyAlternate(g.policies, ex)
		}
		g.exchanges[name] = n
		for _, b := range n.bindings {
			if b.DestinationType == "exchange" {
				todo = append(todo, b.Destination)
			}
		}
		if n.alternate != "" {
			todo = append(todo, n.alternate)
		}
	}
	return nil
}

// policyAlternate is the alternate exchange ex's policy sets, if any: from
// its effective definition when the broker reports one, else from the
// policy listed under its name.
func policyAlternate(policies []brokerapi.Policy, ex exchangeInfo) (name, from string) {
	from = fmt.Sprintf("policy %q", ex.Policy)
	if ae, _ := ex.EffectivePolicyDefinition["alternate-exchange"].(string); ae != "" {
		return ae, from
	}
	for _, p := range policies {
		if p.Name == ex.Policy {
			if ae, _ := p.Definition["alternate-exchange"].(string); ae != "" {
				return ae, from
			}
		}
	}
	return "", ""
}

// queues lists the queues a message published to from may reach, whatever
// its routing key: through every binding, exchange-to-exchange bindings
// and alternate exchanges, each queue once and sorted, at most limit of them
// (truncated says there were more).
func (g *routeGraph) queues(from string, limit int) (queues []string, truncated bool) {
	seenQueue := map[string]bool{}
	seen := map[string]bool{from: true}
	todo := []string{from}
	for len(todo) > 0 {
		n := g.exchanges[todo[0]]
		todo = todo[1:]
		if n == nil || n.missing {
			continue
		}
		next := func(ex string) {
			if !seen[ex] {
				seen[ex] = true
				todo = append(todo, ex)
			}
		}
		for _, b := range n.bindings {
			switch {
			case b.DestinationType == "exchange":
				next(b.Destination)
			case b.DestinationType == "queue" && !seenQueue[b.Destination]:
				if len(seenQueue) == limit {
					truncated = true
					continue
				}
				seenQueue[b.Destination] = true
				queues = append(queues, b.Destination)
			}
		}
		if n.alternate != "" {
			next(n.alternate)
		}
	}
	slices.Sort(queues)
	return queues, truncated
}

// A routeVerdict is whether a message with one routing key reaches a queue.
type routeVerdict struct {
	routed bool
	// unknown, when not routed, says why it cannot be told (an exchange
	// type that routes on more than the key, a graph cut short); "" when
	// the message is returned for sure.
	unknown string
}

// route judges a message published to exchange with key as RabbitMQ routes
// it: each exchange picks its destinations by its type (direct: the
// binding key equals the routing key; topic: the binding key's pattern
// matches it; fanout: every binding), an exchange that picked none hands
// the message to its alternate exchange, destinations that are exchanges
// route it in turn (each exchange once), and it is routed when any queue
// is reached. A missing exchange routes nothing.
func (g *routeGraph) route(exchange, key string) routeVerdict {
	var unknown string
	seen := map[string]bool{exchange: true}
	todo := []string{exchange}
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		n, loaded := g.exchanges[name]
		if !loaded {
			unknown = fmt.Sprintf("exchange %q is past the %d exchanges check follows", name, maxExchangeHops)
			continue
		}
		if n.missing {
			continue
		}
		var dests []binding
		switch n.typ {
		case "direct", "topic", "fanout":
			for _, b := range n.bindings {
				if bindingMatches(n.typ, b.RoutingKey, key) {
					dests = append(dests, b)
				}
			}
		default:
			// headers, x-consistent-hash, x-delayed-message…: they route on
			// more than the key, or by rules check does not model.
			unknown = fmt.Sprintf("exchange %q is of type %s, which routes on more than the routing key", name, n.typ)
			continue
		}
		if len(dests) == 0 && n.alternate != "" {
			dests = []binding{{Destination: n.alternate, DestinationType: "exchange"}}
		}
		for _, d := range dests {
			switch {
			case d.DestinationType == "queue":
				return routeVerdict{routed: true}
			case !seen[d.Destination]:
				seen[d.Destination] = true
				todo = append(todo, d.Destination)
			}
		}
	}
	return routeVerdict{unknown: unknown}
}

// bindingMatches applies one binding key of an exchange of type typ
// (direct, topic or fanout) to a routing key.
func bindingMatches(typ, bindingKey, key string) bool {
	switch typ {
	case "direct":
		return bindingKey == key
	case "topic":
		return brokerapi.TopicMatch(bindingKey, key)
	case "fanout":
		return true
	}
	return false
}
