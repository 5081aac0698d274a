package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/brokerapi"
)

// tailQueuePrefix names tail's temporary queues. Their bindings are never
// copied: two tails copying each other's would keep a route alive after
// the queue it was copied from is gone.
const tailQueuePrefix = brokerapi.TailQueuePrefix

// tailBinding is one binding of tail's queue to the exchange.
type tailBinding struct {
	key  string
	args amqp.Table
	id   string // key and arguments, to compare plans
}

// mirrorPlan is the set of bindings that gives tail's queue a copy of what
// the exchange already routes to a queue, and nothing else: each binding
// to a queue, copied. A message then reaches tail only if it matched a
// binding that also delivers it to that queue, so tail is never the
// route that makes an event routable (the relay publishes with mandatory
// set and takes a routed message as delivered). notes says what tail
// cannot show. An error: no copy of this exchange's bindings is safe.
func mirrorPlan(exchange brokerapi.Exchange, bs []brokerapi.Binding) (plan []tailBinding, notes []string, err error) {
	seen := map[string]bool{}
	viaExchange := 0
	for _, b := range bs {
		if b.DestinationType != "queue" {
			// What a destination exchange routes depends on its own
			// bindings: copying the key would route what it drops.
			viaExchange++
			continue
		}
		if strings.HasPrefix(b.Destination, tailQueuePrefix) {
			continue
		}
		tb, ok, err := copyBinding(exchange.Type, b)
		if err != nil {
			return nil, nil, fmt.Errorf("exchange %q: %w", exchange.Name, err)
		}
		if !ok {
			notes = append(notes, fmt.Sprintf("the binding to queue %q is not copied (its arguments are not all strings, and a copy could match what it does not)", b.Destination))
			continue
		}
		if !seen[tb.id] {
			seen[tb.id] = true
			plan = append(plan, tb)
		}
	}
	if viaExchange > 0 {
		notes = append(notes, fmt.Sprintf("%d exchange-to-exchange binding(s) are not copied: what reaches a queue only through another exchange is not shown", viaExchange))
	}
	if ae, _ := exchange.Arguments["alternate-exchange"].(string); ae != "" {
		notes = append(notes, fmt.Sprintf("what goes to the alternate exchange %q is not shown", ae))
	}
	slices.SortFunc(plan, func(a, b tailBinding) int { return strings.Compare(a.id, b.id) })
	return plan, notes, nil
}

// copyBinding is the binding of tail's queue that matches exactly what b
// matches, for an exchange of type kind. ok is false when no exact copy
// can be made.
func copyBinding(kind string, b brokerapi.Binding) (tb tailBinding, ok bool, err error) {
	switch kind {
	case "topic", "direct":
		// Arguments play no part in routing on these types.
		return tailBinding{key: b.RoutingKey, id: b.RoutingKey}, true, nil
	case "fanout":
		return tailBinding{id: "fanout"}, true, nil
	case "headers":
		args := amqp.Table{}
		for k, v := range b.Arguments {
			s, isString := v.(string)
			if !isString {
				// JSON turns every number into a float; the broker compares
				// types, so a copy could match a header the original does not.
				return tailBinding{}, false, nil
			}
			args[k] = s
		}
		id, _ := json.Marshal(b.Arguments) // sorted keys: one id per set of arguments
		return tailBinding{args: args, id: string(id)}, true, nil
	case "":
		return tailBinding{}, false, fmt.Errorf("the default exchange takes no binding")
	default:
		// A hashing or custom exchange may share its messages among its
		// bindings: one more binding would take events from the queues.
		return tailBinding{}, false, fmt.Errorf("type %q: a binding of tail's could take a share of the events from the queues behind it", kind)
	}
}

// matchedElsewhere reports whether a message with routingKey matches one
// of plan's bindings, which were copied from other queues' bindings: when
// it does not, the binding it was copied from was removed while tail ran
// and the message may have reached tail alone. Headers exchanges are not
// judged (ok is false).
func matchedElsewhere(kind string, plan []tailBinding, routingKey string) (matched, ok bool) {
	switch kind {
	case "topic":
		return slices.ContainsFunc(plan, func(b tailBinding) bool { return brokerapi.TopicMatch(b.key, routingKey) }), true
	case "direct":
		return slices.ContainsFunc(plan, func(b tailBinding) bool { return b.key == routingKey }), true
	case "fanout":
		return len(plan) > 0, true
	}
	return false, false
}
