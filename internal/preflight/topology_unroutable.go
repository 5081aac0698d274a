package preflight

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// This file judges what the relay's publishes will meet: an exchange that
// reaches no queue at all, and the routing keys of recent rows that no
// binding routes. The relay publishes mandatory, so either stalls the
// stream at the first such row (CDCRELAY_UNROUTABLE=stall, the default):
// an Error, as it is what `run` would stop on. With park the rows are
// parked instead and the stream goes on: a warning, since no consumer gets
// them.

// errNoOutboxSession is readRecentKeys failing to connect: the database
// checks report why, so the routing keys are only said to be unchecked.
var errNoOutboxSession = errors.New("no session on the outbox's database")

// unroutableSeverity is what a row the broker cannot route costs.
func unroutableSeverity(unroutable string) Severity {
	if unroutable == config.UnroutablePark {
		return Warn
	}
	return Error
}

// unroutableCost says what happens to such a row, for a finding.
func unroutableCost(unroutable string) string {
	if unroutable == config.UnroutablePark {
		return "such a row is parked as unroutable (CDCRELAY_UNROUTABLE=park): it stays unpublished, only its copy goes to the dead-letter exchange if one is set, and no consumer gets it"
	}
	return "the broker returns such a row and the stream stops on it (CDCRELAY_UNROUTABLE=stall), every later row waiting behind it, until a queue is bound for it"
}

// checkExchangeRoutes judges whether the relay's exchange reaches any
// queue at all (queues: routeGraph.queues from it). Without one the first
// row is returned: an Error (a warning with park: every row would be
// parked). An exchange that reaches queues only through its alternate
// exchange is OK and said so; one with bindings is summed up by the
// length-limit check. ok is false when there is nothing to say here: the
// default exchange (its queues are the routing keys), a missing exchange
// (the exchange check reports it), or bindings that reach queues.
func checkExchangeRoutes(g *routeGraph, vhost, exchange, unroutable string, queues []string) (Finding, bool) {
	n := g.exchanges[exchange]
	if exchange == "" || n == nil || n.missing {
		return Finding{}, false
	}
	if len(queues) > 0 {
		if len(n.bindings) > 0 {
			return Finding{}, false
		}
		return Finding{Check: checkTopology, Message: fmt.Sprintf("exchange %q has no binding; its alternate exchange %q (%s) takes every message and reaches %d queue(s)",
			exchange, n.alternate, n.alternateFrom, len(queues))}, true
	}
	f := Finding{Check: checkTopology, Severity: unroutableSeverity(unroutable),
		Message: fmt.Sprintf("exchange %q (CDCRELAY_EXCHANGE) %s: every message the relay publishes to it reaches no queue; %s", exchange, noQueueReason(g, exchange), unroutableCost(unroutable))}
	if unroutable == config.UnroutablePark {
		f.Message = fmt.Sprintf("exchange %q (CDCRELAY_EXCHANGE) %s: every row would be parked as unroutable (CDCRELAY_UNROUTABLE=park), and no consumer gets any", exchange, noQueueReason(g, exchange))
	}
	f.Remedy = fmt.Sprintf("bind a queue for the routing keys the rows carry: rabbitmqadmin -V %s declare queue name=<queue> durable=true, then rabbitmqadmin -V %s declare binding source=%s destination=<queue> routing_key=<key or pattern> (or the same in your broker definitions); "+
		"or give it an alternate exchange that routes to a queue: rabbitmqctl set_policy -p %s --apply-to exchanges %s-ae %s '{\"alternate-exchange\":\"<exchange>\"}'",
		vhost, vhost, exchange, vhost, exchange, shellQuote("^"+regexp.QuoteMeta(exchange)+"$"))
	return f, true
}

// noQueueReason says why exchange (in g, not missing) reaches no queue:
// no binding nor alternate exchange, or where they lead instead.
func noQueueReason(g *routeGraph, exchange string) string {
	n := g.exchanges[exchange]
	if len(n.bindings) == 0 && n.alternate == "" {
		return "has no binding and no alternate exchange"
	}
	var why []string
	if len(n.bindings) == 0 {
		why = append(why, "has no binding")
	} else {
		why = append(why, fmt.Sprintf("has %d binding(s), but only to exchanges that reach no queue", len(n.bindings)))
	}
	ae := g.exchanges[n.alternate]
	switch {
	case n.alternate == "":
		why = append(why, "no alternate exchange")
	case ae != nil && ae.missing:
		why = append(why, fmt.Sprintf("its alternate exchange %q (%s) does not exist", n.alternate, n.alternateFrom))
	default:
		why = append(why, fmt.Sprintf("its alternate exchange %q (%s) reaches no queue either", n.alternate, n.alternateFrom))
	}
	return strings.Join(why, ", and ")
}

// checkRecentKeys reads the routing keys of the outbox's recent rows
// (readRecentKeys) and judges each against g, extended with the exchanges
// the rows name in their exchange column: each key no binding routes to a
// queue is an Error (a warning with park), naming it and how many rows
// carry it. Keys on an exchange that routes on more than the key (headers)
// are said to be unchecked. A key on CDCRELAY_EXCHANGE when that reaches no
// queue at all is left to checkExchangeRoutes.
func (a *managementAPI) checkRecentKeys(ctx context.Context, g *routeGraph, cfg config.Config, vhost string, opts Options) []Finding {
	if cfg.DatabaseURL == "" {
		return nil // the database check reports it
	}
	rk, err := readRecentKeys(ctx, cfg, opts)
	if errors.Is(err, errNoOutboxSession) {
		return []Finding{{Check: checkTopology, Message: "the routing keys of recent rows were not checked against the bindings: the database could not be reached (see the database findings)"}}
	}
	if err != nil {
		return []Finding{{Check: checkTopology, Severity: Warn, Message: fmt.Sprintf("could not check the routing keys of recent rows against the bindings: %v", err),
			Remedy: "fix what the database findings report about the table and its mapping, then check again"}}
	}
	if len(rk.keys) == 0 {
		return []Finding{{Check: checkTopology, Message: "no row in the outbox: no routing key to check against the bindings"}}
	}
	var named []string
	for _, k := range rk.keys {
		if k.exchange != "" {
			named = append(named, k.exchange)
		}
	}
	if err := a.extendRouteGraph(ctx, g, vhost, named...); err != nil {
		return []Finding{unchecked("the exchanges named by recent rows", err)}
	}
	relayQueues, _ := g.queues(cfg.Exchange, 1)
	var bad []Finding
	unknown := map[string]string{}
	var order []string // the exchanges of unknown, in the order first met
	routed, judged := 0, 0
	for _, k := range rk.keys {
		ex := k.exchange
		if ex == "" {
			ex = cfg.Exchange
		}
		var f Finding
		var ok bool
		switch {
		case ex == "":
			f, ok = a.judgeDefaultExchangeKey(ctx, vhost, k, rk.rows, cfg.Unroutable)
		case k.exchange == "" && len(relayQueues) == 0:
			continue // checkExchangeRoutes reports the exchange, or the exchange check its absence
		default:
			f, ok = judgeKey(g, vhost, ex, k, rk.rows, cfg.Unroutable)
		}
		judged++
		switch {
		case ok:
			routed++
		case f.Severity == OK: // not checked
			if _, seen := unknown[ex]; !seen {
				order = append(order, ex)
			}
			unknown[ex] = f.Message
		default:
			bad = append(bad, f)
		}
	}
	summary := fmt.Sprintf("%d of the %d distinct routing key(s) of the %d rows read (the newest %d by %s and up to %d unpublished) reach a queue", routed, judged, rk.rows, recentRows, cfg.IDColumn, recentRows)
	if rk.distinct > len(rk.keys) {
		summary += fmt.Sprintf(" (the %d most frequent of %d judged)", len(rk.keys), rk.distinct)
	}
	fs := []Finding{{Check: checkTopology, Message: summary}}
	for _, ex := range order {
		fs = append(fs, Finding{Check: checkTopology, Message: unknown[ex]})
	}
	return append(fs, bad...)
}

// judgeKey routes k on exchange ex (which rows name, or CDCRELAY_EXCHANGE)
// through g. ok when it reaches a queue; otherwise the finding: an OK one
// when it cannot be told, else the unroutable key's.
func judgeKey(g *routeGraph, vhost, ex string, k recentKey, rows int, unroutable string) (Finding, bool) {
	if n := g.exchanges[ex]; n != nil && n.missing {
		return Finding{Check: checkTopology, Severity: unroutableSeverity(unroutable),
			Message: fmt.Sprintf("exchange %q, named by the exchange column of %s with routing key %q, does not exist; %s", ex, k.describeRows(rows), k.key, strings.Replace(unroutableCost(unroutable), "until a queue is bound for it", "until the exchange is declared", 1)),
			Remedy:  fmt.Sprintf("declare it (rabbitmqadmin -V %s declare exchange name=%s type=topic durable=true) and bind its queues, or correct the services that write this exchange name", vhost, ex)}, false
	}
	v := g.route(ex, k.key)
	switch {
	case v.routed:
		return Finding{}, true
	case v.unknown != "":
		return Finding{Check: checkTopology, Message: fmt.Sprintf("routing keys on exchange %q not checked: %s", ex, v.unknown)}, false
	}
	return Finding{Check: checkTopology, Severity: unroutableSeverity(unroutable),
		Message: fmt.Sprintf("no binding routes routing key %q on exchange %q to a queue, and %s carry it: %s", k.key, ex, k.describeRows(rows), unroutableCost(unroutable)),
		Remedy: fmt.Sprintf("bind the queue that should get these events: rabbitmqadmin -V %s declare binding source=%s destination=<queue> routing_key=%s (or a pattern that matches it, on a topic exchange), or correct the services that write this key",
			vhost, ex, shellQuote(k.key))}, false
}

// judgeDefaultExchangeKey judges k on the default exchange, which routes a
// message to the queue its routing key names.
func (a *managementAPI) judgeDefaultExchangeKey(ctx context.Context, vhost string, k recentKey, rows int, unroutable string) (Finding, bool) {
	_, err := a.Queue(ctx, vhost, k.key)
	switch {
	case err == nil:
		return Finding{}, true
	case errors.Is(err, errNotFound):
		return Finding{Check: checkTopology, Severity: unroutableSeverity(unroutable),
			Message: fmt.Sprintf("no queue is named %q, the routing key of %s on the default exchange (CDCRELAY_EXCHANGE is empty): %s", k.key, k.describeRows(rows), unroutableCost(unroutable)),
			Remedy:  fmt.Sprintf("declare queue %s (rabbitmqadmin -V %s declare queue name=%s durable=true), or correct the services that write this key", k.key, vhost, shellQuote(k.key))}, false
	}
	return Finding{Check: checkTopology, Message: fmt.Sprintf("routing keys on the default exchange not checked: %v", err)}, false
}
