package preflight

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/brokerapi"
	"github.com/cdcrelay/cdcrelay/internal/config"
)

// checkTopology names the findings about what the relay's exchanges route
// to, which AMQP 0.9.1 cannot list: only the management HTTP API can.
const checkTopology = "topology"

// managementURLVariable is the optional setting that lets check read
// bindings, queue arguments and policies through the management API.
const managementURLVariable = brokerapi.Variable

// managementURL is the management API URL check uses: the one seam between
// the checks and where the setting comes from.
func managementURL(cfg config.Config) string { return cfg.AMQPManagementURL }

// maxBoundQueues bounds how many queues (reached directly or through
// exchange-to-exchange bindings) check looks up one by one, so a vhost with
// a fan-out to thousands of queues costs a bounded number of requests.
const maxBoundQueues = 200

// maxExchangeHops bounds how many exchanges the walk from the relay's
// exchange visits through exchange-to-exchange bindings.
const maxExchangeHops = 50

// defaultOverflow is what a queue with a length limit does when it is full
// and neither an argument nor a policy says otherwise: it accepts (acks) the
// new message and drops the oldest one.
const defaultOverflow = "drop-head"

// topologyChecks reads the broker's bindings and queue limits through the
// management API at mgmtURL (empty: not configured) and warns about what
// loses events the relay counts as delivered: a dead-letter exchange that
// routes nowhere and a bound queue that drops its oldest messages when
// full. Without mgmtURL it says once that these were not checked. Every
// finding is scrubbed of mgmtURL's password.
func topologyChecks(ctx context.Context, cfg config.Config, mgmtURL string, opts Options) []Finding {
	nodes := cfg.AMQPNodes() // every node serves the same vhost: the first one's URL says which
	if len(nodes) == 0 {
		return nil // the broker check already reports a missing or bad AMQP URL
	}
	uri, err := amqp.ParseURI(nodes[0])
	if err != nil {
		return nil
	}
	if strings.TrimSpace(mgmtURL) == "" {
		how := fmt.Sprintf("set %s=http://user:password@host:15672 (the management plugin's API; a user with the monitoring tag and access to vhost %q) to check them", managementURLVariable, uri.Vhost)
		return []Finding{{Check: checkTopology, Message: "bindings, queue length limits and the dead-letter exchange's bindings were not checked (AMQP cannot list them): " + how,
			Remedy: how}}
	}
	api, err := newManagementAPI(cfg, mgmtURL)
	if err != nil {
		return scrubManagement([]Finding{{Check: checkTopology, Severity: Warn, Message: fmt.Sprintf("%s: %v", managementURLVariable, err),
			Remedy: "use http://user:password@host:15672 or https://…, with reserved characters in the password percent-encoded"}}, mgmtURL)
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	// One request first, so a wrong URL or login is one finding, not one
	// per check. (GET /api/vhosts/<vhost> would check the vhost too, but
	// RabbitMQ 3.10 answers it only to administrators.)
	if err := api.get(ctx, &map[string]any{}, "whoami"); err != nil {
		return scrubManagement([]Finding{unchecked(fmt.Sprintf("bindings and queue limits on vhost %q", uri.Vhost), err)}, mgmtURL)
	}
	g := newRouteGraph()
	var starts []string
	for _, ex := range []string{cfg.Exchange, cfg.DeadLetterExchange} {
		if ex != "" {
			starts = append(starts, ex)
		}
	}
	if err := api.extendRouteGraph(ctx, g, uri.Vhost, starts...); err != nil {
		return scrubManagement([]Finding{unchecked(fmt.Sprintf("the bindings of exchanges %q on vhost %q", starts, uri.Vhost), err)}, mgmtURL)
	}
	var fs []Finding
	if cfg.DeadLetterExchange != "" {
		if f, ok := checkDeadLetterRoutes(g, uri.Vhost, cfg.DeadLetterExchange); ok {
			fs = append(fs, f)
		}
	}
	queues, truncated := g.queues(cfg.Exchange, maxBoundQueues)
	if f, ok := checkExchangeRoutes(g, uri.Vhost, cfg.Exchange, cfg.Unroutable, queues); ok {
		fs = append(fs, f)
	}
	fs = append(fs, api.checkRecentKeys(ctx, g, cfg, uri.Vhost, opts)...)
	fs = append(fs, api.checkQueueOverflow(ctx, g, uri.Vhost, cfg.Exchange, queues, truncated, inFlightOf(cfg))...)
	fs = append(fs, api.checkDeprecatedUsed(ctx)...)
	return scrubManagement(fs, mgmtURL)
}

// scrubManagement hides mgmtURL and its password in every finding: until
// config knows the setting, config.Config.Scrub (which Run applies) does
// not.
func scrubManagement(fs []Finding, mgmtURL string) []Finding {
	secrets := []string{mgmtURL}
	for _, pw := range config.Secrets(mgmtURL) {
		secrets = append(secrets, pw, url.QueryEscape(pw), url.PathEscape(pw))
	}
	// Longest first, so the URL goes whole before its password does.
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	return scrub(fs, func(s string) string {
		for _, sec := range secrets {
			if sec == mgmtURL {
				s = strings.ReplaceAll(s, sec, config.Redact(sec))
			} else if len(sec) >= 4 {
				s = strings.ReplaceAll(s, sec, "xxxxx")
			}
		}
		return s
	})
}

// managementAPI is the topology checks' client of the management API.
type managementAPI struct{ *brokerapi.Client }

func newManagementAPI(cfg config.Config, raw string) (*managementAPI, error) {
	var tc *tls.Config
	if u, err := url.Parse(strings.TrimSpace(raw)); err == nil && u.Scheme == "https" {
		var err error
		if tc, err = cfg.AMQPTLS(); err != nil {
			return nil, fmt.Errorf("TLS files: %w", err)
		}
	}
	c, err := brokerapi.New(raw, config.Redact(raw), tc)
	if err != nil {
		return nil, err
	}
	return &managementAPI{c}, nil
}

// errNotFound is a 404: the vhost, exchange or queue does not exist.
var errNotFound = brokerapi.ErrNotFound

// get is brokerapi.Client.Get.
func (a *managementAPI) get(ctx context.Context, out any, segments ...string) error {
	return a.Get(ctx, out, segments...)
}

type (
	binding      = brokerapi.Binding
	exchangeInfo = brokerapi.Exchange
	queueInfo    = brokerapi.Queue
)

// unchecked is the finding for a topology check the API did not answer.
func unchecked(what string, err error) Finding {
	return Finding{Check: checkTopology, Severity: Warn, Message: fmt.Sprintf("could not check %s: %v", what, err),
		Remedy: "check " + managementURLVariable + " (the management plugin's URL, a user with the monitoring tag and access to the vhost), or unset it to skip these checks"}
}

// checkDeadLetterRoutes warns when the dead-letter exchange reaches no
// queue (no binding, and no alternate exchange that leads to one): the
// relay publishes a parked row's copy there with mandatory set, the broker
// returns it, and the copy is lost (the row itself stays parked). ok is
// false when the exchange does not exist, which the exchange check
// already reports as an Error.
func checkDeadLetterRoutes(g *routeGraph, vhost, dlx string) (f Finding, ok bool) {
	n := g.exchanges[dlx]
	if n == nil || n.missing {
		return Finding{}, false
	}
	if queues, _ := g.queues(dlx, 1); len(queues) > 0 {
		if len(n.bindings) > 0 {
			return Finding{Check: checkTopology, Message: fmt.Sprintf("dead-letter exchange %q has %d binding(s)", dlx, len(n.bindings))}, true
		}
		return Finding{Check: checkTopology, Message: fmt.Sprintf("dead-letter exchange %q has no binding but an alternate exchange (%q) takes what it cannot route", dlx, n.alternate)}, true
	}
	return Finding{Check: checkTopology, Severity: Warn,
		Message: fmt.Sprintf("dead-letter exchange %q (CDCRELAY_DEAD_LETTER_EXCHANGE) %s: the copy of a parked poison row published there (with the row's routing key) is returned and lost, counted in cdcrelay_dead_letter_failures_total; the row stays parked in the table", dlx, noQueueReason(g, dlx)),
		Remedy: fmt.Sprintf("bind a queue to it for every routing key, e.g. rabbitmqadmin -V %s declare queue name=%s.parked durable=true, then rabbitmqadmin -V %s declare binding source=%s destination=%s.parked routing_key='#' (a topic exchange), or the same in your broker definitions",
			vhost, dlx, vhost, dlx, dlx)}, true
}

// checkQueueOverflow warns for each queue the relay's exchange feeds
// (queues, from routeGraph.queues: through exchange-to-exchange bindings
// and alternate exchanges too; truncated when there were more) with a
// length limit that drops the oldest message when full: the broker acks
// the relay's publish, so the relay moves on, and an event the consumer
// has not read yet is gone. It also warns about a quorum queue's limit,
// which the relay's in-flight window w overshoots, and, reading the same
// answer, about the deprecated features each queue relies on
// (deprecatedQueueFindings).
func (a *managementAPI) checkQueueOverflow(ctx context.Context, g *routeGraph, vhost, exchange string, queues []string, truncated bool, w inFlight) []Finding {
	if exchange == "" {
		// The default exchange routes to the queue a routing key names; which
		// queues those are depends on the rows.
		return []Finding{{Check: checkTopology, Message: "queue length limits not checked: CDCRELAY_EXCHANGE is the default exchange, whose queues are the routing keys"}}
	}
	if n := g.exchanges[exchange]; n == nil || n.missing || len(queues) == 0 {
		return nil // the exchange check, or checkExchangeRoutes, reports it
	}
	var fs []Finding
	for _, name := range queues {
		q, err := a.Queue(ctx, vhost, name)
		if err != nil {
			if errors.Is(err, errNotFound) {
				continue // deleted since the bindings were read
			}
			fs = append(fs, unchecked(fmt.Sprintf("queue %q", name), err))
			continue
		}
		if f, ok := overflowFinding(vhost, exchange, q, w); ok {
			fs = append(fs, f)
		}
		fs = append(fs, deprecatedQueueFindings(vhost, exchange, q)...)
	}
	summary := fmt.Sprintf("%d queue(s) bound to exchange %q checked for length limits and deprecated features", len(queues), exchange)
	if truncated {
		summary += fmt.Sprintf(" (the first %d; more are bound)", maxBoundQueues)
	}
	return append([]Finding{{Check: checkTopology, Message: summary}}, fs...)
}

// inFlight is the relay's publishing window: at most messages unconfirmed
// in all, shared by channels confirm channels (the publisher gives each
// channel messages/channels). A quorum queue takes all of it past its
// limit (overshoot).
type inFlight struct{ messages, channels int }

func inFlightOf(cfg config.Config) inFlight {
	return inFlight{messages: cfg.MaxInFlight, channels: cfg.PublishChannels}
}

// overshoot says by how much a quorum queue's limit can be overshot.
// Measured on RabbitMQ 3.10.8, 4.0.5 and 4.3.6, with x-max-length 2 and
// reject-publish: 50 messages published in a pipeline were all acked and
// the queue held 50 (31 to 39, then nacks, in two runs on a busy machine
// under the race detector); published one at a time it held 3 (ack, ack, ack, then
// nacks). The queue learns it is full only after the fact and tells the
// publisher's channel so asynchronously, so what overtakes that notice
// gets in; a classic queue judges each message as it arrives and held 2
// either way.
func (w inFlight) overshoot() string {
	return fmt.Sprintf("up to the relay's in-flight window past the limit (CDCRELAY_MAX_IN_FLIGHT=%d, shared by CDCRELAY_PUBLISH_CHANNELS=%d)", w.messages, w.channels)
}

// isQuorum tells a quorum queue by the type the API reports, else by its
// x-queue-type argument.
func isQuorum(q queueInfo) bool {
	if q.Type != "" {
		return q.Type == "quorum"
	}
	t, _ := q.Arguments["x-queue-type"].(string)
	return t == "quorum"
}

// overflowFinding judges one queue's length limit. A limit comes from the
// queue's arguments or its effective policy (RabbitMQ applies the lower of
// the two); the overflow behaviour from the argument, else the policy, else
// drop-head (the argument wins over a policy for overflow). ok is false for
// a queue without a limit. w is the relay's in-flight window, by which a
// quorum queue's limit can be overshot.
func overflowFinding(vhost, exchange string, q queueInfo, w inFlight) (Finding, bool) {
	var limits []string
	keys := []struct{ arg, policy string }{{"x-max-length", "max-length"}, {"x-max-length-bytes", "max-length-bytes"}}
	if q.Type == "stream" {
		keys = append(keys, struct{ arg, policy string }{"x-max-age", "max-age"})
	}
	for _, l := range keys {
		if v, ok := q.Arguments[l.arg]; ok {
			limits = append(limits, fmt.Sprintf("%s=%v (argument)", l.arg, number(v)))
		}
		if v, ok := q.EffectivePolicyDefinition[l.policy]; ok {
			limits = append(limits, fmt.Sprintf("%s=%v (policy %q)", l.policy, number(v), q.Policy))
		}
	}
	if len(limits) == 0 {
		return Finding{}, false
	}
	if q.Type == "stream" {
		// A stream's length limit is retention, not overflow: it takes
		// every publish and discards whole old segments, read or not, and
		// has no reject-publish to offer.
		return Finding{Check: checkTopology, Severity: Warn,
			Message: fmt.Sprintf("stream %q, bound to exchange %q, has retention %s: the broker acks every publish and discards the oldest segments once over it, whether or not a consumer has read them; a consumer further behind than that misses events the relay counts as delivered", q.Name, exchange, strings.Join(limits, " and ")),
			Remedy:  "size the retention (x-max-length-bytes, x-max-age) for the longest a consumer may lag, and alert on consumer offset lag; a stream cannot refuse a publish when full"}, true
	}
	overflow, from := defaultOverflow, "the default"
	if v, ok := q.EffectivePolicyDefinition["overflow"].(string); ok {
		overflow, from = v, fmt.Sprintf("policy %q", q.Policy)
	}
	if v, ok := q.Arguments["x-overflow"].(string); ok {
		overflow, from = v, "argument x-overflow"
	}
	quorum := isQuorum(q)
	f := Finding{Check: checkTopology}
	limited := fmt.Sprintf("queue %q, bound to exchange %q, has %s", q.Name, exchange, strings.Join(limits, " and "))
	switch {
	case overflow == "reject-publish" && quorum:
		f.Severity = Warn
		f.Message = fmt.Sprintf("%s and overflow reject-publish (%s), but a quorum queue refuses only once it is over its limit and takes what was already published: it can hold %s. Nothing is lost, but the limit is not a hard bound", limited, from, w.overshoot())
		f.Remedy = fmt.Sprintf("if the bound must hold, use a classic queue with reject-publish (it refuses at the limit); else leave %d messages of headroom in the limit, or lower CDCRELAY_MAX_IN_FLIGHT", w.messages)
	case overflow == "reject-publish":
		f.Message = fmt.Sprintf("%s and overflow reject-publish (%s): a full queue nacks and the relay publishes again after a backoff, without loss", limited, from)
	case overflow == "reject-publish-dlx" && !quorum:
		f.Message = fmt.Sprintf("%s and overflow reject-publish-dlx (%s): a full queue nacks, and the relay publishes again, without loss; the refused copies also go to the queue's dead-letter exchange, if it routes them", limited, from)
	default:
		f.Severity = Warn
		what := overflow
		if overflow == "reject-publish-dlx" {
			// Measured on 3.10.8 and 4.3.6: a quorum queue takes the
			// setting and then acks every publish and keeps the newest.
			what = "reject-publish-dlx, which a quorum queue does not support"
		}
		f.Message = fmt.Sprintf("%s and overflow %s (%s): when it is full the broker acks the relay's publish and silently drops the oldest message, an event the relay counts as delivered", limited, what, from)
		how := fmt.Sprintf("a policy (rabbitmqctl set_policy -p %s --apply-to queues <name> '^%s$' '{\"overflow\":\"reject-publish\", …the limits…}')", vhost, regexp.QuoteMeta(q.Name))
		if q.Policy != "" {
			// One policy applies to a queue: a new one would replace it.
			how = fmt.Sprintf("policy %q (add \"overflow\":\"reject-publish\" to its definition)", q.Policy)
		}
		if _, ok := q.Arguments["x-overflow"]; ok {
			// The argument wins over any policy for overflow.
			how = "the queue's x-overflow argument (delete and redeclare the queue; a policy cannot override it)"
		}
		f.Remedy = fmt.Sprintf("make a full queue refuse new messages instead: set overflow to reject-publish in %s; the broker then nacks and the relay publishes again after a backoff, without loss", how)
		if quorum {
			f.Remedy += fmt.Sprintf(". On a quorum queue reject-publish still lets %s: use a classic queue if the bound must hold", w.overshoot())
		} else {
			f.Remedy += ". reject-publish-dlx keeps every event too, and also dead-letters the refused copies"
		}
	}
	return f, true
}

// number prints a JSON number without a trailing ".0" or an exponent.
func number(v any) any {
	if f, ok := v.(float64); ok && f == float64(int64(f)) {
		return strconv.FormatInt(int64(f), 10)
	}
	return v
}
