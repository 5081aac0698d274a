package preflight

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cdcrelay/cdcrelay/internal/brokerapi"
)

// deprecatedQueueFindings warns about the deprecated broker features a
// queue the relay's exchange feeds relies on: a later RabbitMQ refuses
// them, so the queue's declaration (by its consumers, or the broker
// definitions) fails there, or they already cost the relay's events their
// safety. One finding per kind, each with its remedy; none for a queue
// that uses none.
func deprecatedQueueFindings(vhost, exchange string, q queueInfo) []Finding {
	var fs []Finding
	where := fmt.Sprintf("queue %q, bound to exchange %q,", q.Name, exchange)
	if !q.Durable && !q.Exclusive {
		// An exclusive queue is its connection's own (cdcrelay tail's):
		// RabbitMQ deprecates only the transient queues that outlive their
		// declaring connection.
		fs = append(fs, Finding{Check: checkTopology, Severity: Warn,
			Message: fmt.Sprintf("%s is transient (durable=false) and not exclusive: it loses its messages, events the relay counts as delivered, when its node restarts; RabbitMQ 4.3 as upstream ships it refuses to declare one (deprecated feature transient_nonexcl_queues: 541 INTERNAL_ERROR, which closes the connection)", where),
			Remedy:  "declare it durable (a quorum queue, or a durable classic queue): delete it and declare it again with durable=true; a queue that should vanish when unused can keep durable=true and expire by a queue TTL (x-expires)"})
	}
	if f, ok := classicV1Finding(where, q); ok {
		fs = append(fs, f)
	}
	if keys := queueSettings(q, "queue-master-locator"); len(keys) > 0 {
		fs = append(fs, Finding{Check: checkTopology, Severity: Warn,
			Message: fmt.Sprintf("%s has %s: deprecated (queue_master_locator), denied by default in RabbitMQ 4.3, which closes the declaring connection with 541 INTERNAL_ERROR and refuses a policy with it", where, strings.Join(keys, " and ")),
			Remedy:  "use queue-leader-locator (x-queue-leader-locator) instead: " + dropSettings(q, "queue-master-locator")})
	}
	if mode, ok := q.EffectivePolicyDefinition["ha-mode"]; ok {
		fs = append(fs, Finding{Check: checkTopology, Severity: Warn,
			Message: fmt.Sprintf("%s is mirrored by %s (ha-mode=%v): classic queue mirroring is deprecated on RabbitMQ 3.x and removed from 4.0, where the queue keeps a single replica and is down while its node is", where, policyName(q), mode),
			Remedy:  "use a quorum queue (x-queue-type=quorum) where events must survive a node, and drop the ha-* keys from " + policyName(q)})
	}
	return fs
}

// classicV1Finding warns about lazy mode and classic queue storage version
// 1. Lazy mode has been ignored since RabbitMQ 3.12 (every classic queue
// pages to disk as a lazy one did); version 1 is gone from 4.3, which
// refuses x-queue-version=1 with 406 PRECONDITION_FAILED (measured on
// 4.3.6, which still takes x-queue-mode and both keys in a policy).
func classicV1Finding(where string, q queueInfo) (Finding, bool) {
	var keys, why, drop []string
	if k := queueSettings(q, "queue-mode"); len(k) > 0 {
		keys, drop = append(keys, k...), append(drop, "queue-mode")
		why = append(why, "lazy mode is ignored since RabbitMQ 3.12")
	}
	if k := queueSettings(q, "queue-version"); len(k) > 0 && (isOne(q.Arguments["x-queue-version"]) || isOne(q.EffectivePolicyDefinition["queue-version"])) {
		keys, drop = append(keys, k...), append(drop, "queue-version")
		why = append(why, "storage version 1 is removed from RabbitMQ 4.3, which refuses to declare a queue with x-queue-version=1 (406 PRECONDITION_FAILED)")
	}
	if len(keys) == 0 {
		return Finding{}, false
	}
	return Finding{Check: checkTopology, Severity: Warn,
		Message: fmt.Sprintf("%s has deprecated classic queue settings %s: %s", where, strings.Join(keys, " and "), strings.Join(why, "; ")),
		Remedy:  dropSettings(q, drop...)}, true
}

// isOne tells whether a JSON value is the number 1.
func isOne(v any) bool {
	f, ok := v.(float64)
	return ok && f == 1
}

// queueSettings lists the queue's settings of a policy key (x-<key> as an
// argument, <key> in its effective policy) as "name=value (source)".
func queueSettings(q queueInfo, key string) []string {
	var out []string
	if v, ok := q.Arguments["x-"+key]; ok {
		out = append(out, fmt.Sprintf("x-%s=%v (argument)", key, number(v)))
	}
	if v, ok := q.EffectivePolicyDefinition[key]; ok {
		out = append(out, fmt.Sprintf("%s=%v (%s)", key, number(v), policyName(q)))
	}
	return out
}

// dropSettings says how to remove the keys from the queue: a policy's
// key goes from its definition, an argument only by declaring the queue
// again (an argument cannot be changed on an existing queue).
func dropSettings(q queueInfo, keys ...string) string {
	var how []string
	for _, k := range keys {
		if _, ok := q.EffectivePolicyDefinition[k]; ok {
			how = append(how, fmt.Sprintf("remove %q from %s", k, policyName(q)))
		}
	}
	for _, k := range keys {
		if _, ok := q.Arguments["x-"+k]; ok {
			how = append(how, fmt.Sprintf("delete the queue (once drained) and declare it again without the x-%s argument", k))
		}
	}
	return strings.Join(how, "; ")
}

// policyName names the policy a queue's effective definition comes from:
// RabbitMQ names the policy, not an operator policy merged into it.
func policyName(q queueInfo) string {
	if q.Policy == "" {
		return "an operator policy"
	}
	return fmt.Sprintf("policy %q", q.Policy)
}

// checkDeprecatedUsed reports each deprecated feature the broker says is
// in use (GET /api/deprecated-features/used, RabbitMQ 3.13 and later). The
// list is the broker's, node-wide: the relay's queues or anyone else's.
// It never fails check: a broker that predates the list (404) adds
// nothing, and one that does not answer adds an OK line saying so.
func (a *managementAPI) checkDeprecatedUsed(ctx context.Context) []Finding {
	used, err := a.DeprecatedFeaturesUsed(ctx)
	switch {
	case errors.Is(err, errNotFound):
		return nil // before RabbitMQ 3.13: no such list
	case err != nil:
		return []Finding{{Check: checkTopology, Message: fmt.Sprintf("the broker's deprecated features in use were not listed: %v", err)}}
	}
	fs := make([]Finding, 0, len(used))
	for _, u := range used {
		fs = append(fs, deprecatedUsedFinding(u))
	}
	return fs
}

// deprecatedPhases glosses RabbitMQ's deprecation phases.
var deprecatedPhases = map[string]string{
	"permitted_by_default": "permitted by default, for now",
	"denied_by_default":    "denied by default: a new use fails unless the configuration permits it",
	"disconnected":         "no configuration permits it any more",
	"removed":              "removed from this RabbitMQ",
}

func deprecatedUsedFinding(u brokerapi.DeprecatedFeature) Finding {
	phase := u.DeprecationPhase
	if gloss, ok := deprecatedPhases[phase]; ok {
		phase += ", " + gloss
	}
	msg := fmt.Sprintf("deprecated feature %q is in use on the broker (somewhere on it, not necessarily by the relay's queues; %s)", u.Name, phase)
	if u.Desc != "" {
		msg += ": " + u.Desc
	}
	remedy := "find what uses it (rabbitmq-diagnostics check_if_any_deprecated_features_are_used) and replace it before upgrading to a RabbitMQ that refuses it"
	if u.DocURL != "" {
		remedy += "; see " + u.DocURL
	}
	return Finding{Check: checkTopology, Severity: Warn, Message: msg, Remedy: remedy}
}
