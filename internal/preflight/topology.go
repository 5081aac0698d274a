package preflight

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// checkTopology names the findings about what the relay's exchanges route
// to, which AMQP 0.9.1 cannot list: only the management HTTP API can.
const checkTopology = "topology"

// managementURLVariable is the optional setting that lets check read
// bindings, queue arguments and policies through the management API.
const managementURLVariable = config.Prefix + "AMQP_MANAGEMENT_URL"

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
	var fs []Finding
	if cfg.DeadLetterExchange != "" {
		if f, ok := api.checkDeadLetterRoutes(ctx, uri.Vhost, cfg.DeadLetterExchange); ok {
			fs = append(fs, f)
		}
	}
	fs = append(fs, api.checkQueueOverflow(ctx, uri.Vhost, cfg.Exchange)...)
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

// managementAPI is a client of RabbitMQ's management HTTP API.
type managementAPI struct {
	base       string // scheme://host:port[/path_prefix], without the credentials
	where      string // the URL redacted, for messages
	user, pass string
	client     *http.Client
}

func newManagementAPI(cfg config.Config, raw string) (*managementAPI, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return nil, errors.New("not a valid URL") // url.Error quotes the URL, password included
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("want http:// or https://host:port, got scheme %q", u.Scheme)
	}
	api := &managementAPI{where: config.Redact(raw), client: &http.Client{}}
	if u.User != nil {
		api.user = u.User.Username()
		api.pass, _ = u.User.Password()
	}
	if u.Scheme == "https" {
		// The management listener is usually signed by the CA the AMQP
		// listener is; the client certificate goes along for brokers that
		// require one on both.
		tc, err := cfg.AMQPTLS()
		if err != nil {
			return nil, fmt.Errorf("TLS files: %w", err)
		}
		if tc == nil {
			tc = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		api.client.Transport = &http.Transport{TLSClientConfig: tc, Proxy: http.ProxyFromEnvironment}
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	api.base = strings.TrimSuffix(u.String(), "/")
	return api, nil
}

// errNotFound is a 404: the vhost, exchange or queue does not exist.
var errNotFound = errors.New("not found")

// get decodes the JSON answer to GET base/api/<segments…>, each segment
// path-escaped (a vhost "/" is %2F).
func (a *managementAPI) get(ctx context.Context, out any, segments ...string) error {
	path := "/api"
	for _, s := range segments {
		path += "/" + url.PathEscape(s)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+path, nil)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	if a.user != "" {
		req.SetBasicAuth(a.user, a.pass)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s from %s: %w", path, a.where, err)
	}
	defer func() { _ = resp.Body.Close() }()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("GET %s: %w", path, errNotFound)
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("GET %s from %s: %s: the user needs the management or monitoring tag and access to the vhost", path, a.where, resp.Status)
	case resp.StatusCode != http.StatusOK:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return fmt.Errorf("GET %s from %s: %s %s", path, a.where, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("GET %s from %s: decode the answer (is it the management API?): %w", path, a.where, err)
	}
	return nil
}

// binding is one entry of /api/exchanges/<vhost>/<name>/bindings/source.
type binding struct {
	Destination     string `json:"destination"`
	DestinationType string `json:"destination_type"` // "queue" or "exchange"
	RoutingKey      string `json:"routing_key"`
}

// exchangeInfo is the part of /api/exchanges/<vhost>/<name> check reads.
type exchangeInfo struct {
	Arguments map[string]any `json:"arguments"`
	Policy    string         `json:"policy"`
}

// queueInfo is the part of /api/queues/<vhost>/<name> check reads.
type queueInfo struct {
	Name      string         `json:"name"`
	Type      string         `json:"type"`
	Arguments map[string]any `json:"arguments"`
	// EffectivePolicyDefinition is the policy and operator policy merged,
	// as the queue applies them.
	EffectivePolicyDefinition map[string]any `json:"effective_policy_definition"`
	Policy                    string         `json:"policy"`
}

// unchecked is the finding for a topology check the API did not answer.
func unchecked(what string, err error) Finding {
	return Finding{Check: checkTopology, Severity: Warn, Message: fmt.Sprintf("could not check %s: %v", what, err),
		Remedy: "check " + managementURLVariable + " (the management plugin's URL, a user with the monitoring tag and access to the vhost), or unset it to skip these checks"}
}

// checkDeadLetterRoutes warns when the dead-letter exchange has no binding:
// the relay publishes a parked row's copy there with mandatory set, the
// broker returns it, and the copy is lost (the row itself stays parked).
// ok is false when the exchange does not exist, which the exchange check
// already reports as an Error.
func (a *managementAPI) checkDeadLetterRoutes(ctx context.Context, vhost, dlx string) (f Finding, ok bool) {
	what := fmt.Sprintf("the bindings of dead-letter exchange %q", dlx)
	var bs []binding
	if err := a.get(ctx, &bs, "exchanges", vhost, dlx, "bindings", "source"); err != nil {
		if errors.Is(err, errNotFound) {
			return Finding{}, false
		}
		return unchecked(what, err), true
	}
	if len(bs) > 0 {
		return Finding{Check: checkTopology, Message: fmt.Sprintf("dead-letter exchange %q has %d binding(s)", dlx, len(bs))}, true
	}
	var ex exchangeInfo
	if err := a.get(ctx, &ex, "exchanges", vhost, dlx); err != nil {
		return unchecked(what, err), true
	}
	if ae, _ := ex.Arguments["alternate-exchange"].(string); ae != "" {
		return Finding{Check: checkTopology, Message: fmt.Sprintf("dead-letter exchange %q has no binding but an alternate exchange (%q) takes what it cannot route", dlx, ae)}, true
	}
	return Finding{Check: checkTopology, Severity: Warn,
		Message: fmt.Sprintf("dead-letter exchange %q (CDCRELAY_DEAD_LETTER_EXCHANGE) has no binding: the copy of a parked poison row published there (with the row's routing key) is returned and lost, counted in cdcrelay_dead_letter_failures_total; the row stays parked in the table", dlx),
		Remedy: fmt.Sprintf("bind a queue to it for every routing key, e.g. rabbitmqadmin -V %s declare queue name=%s.parked durable=true, then rabbitmqadmin -V %s declare binding source=%s destination=%s.parked routing_key='#' (a topic exchange), or the same in your broker definitions",
			vhost, dlx, vhost, dlx, dlx)}, true
}

// checkQueueOverflow walks from exchange through its bindings (and
// exchange-to-exchange bindings) to the queues it feeds and warns for each
// one with a length limit that drops the oldest message when full: the
// broker acks the relay's publish, so the relay moves on, and an event the
// consumer has not read yet is gone.
func (a *managementAPI) checkQueueOverflow(ctx context.Context, vhost, exchange string) []Finding {
	if exchange == "" {
		// The default exchange routes to the queue a routing key names; which
		// queues those are depends on the rows.
		return []Finding{{Check: checkTopology, Message: "queue length limits not checked: CDCRELAY_EXCHANGE is the default exchange, whose queues are the routing keys"}}
	}
	queues, truncated, err := a.boundQueues(ctx, vhost, exchange)
	if errors.Is(err, errNotFound) {
		return nil // the exchange check reports it
	}
	if err != nil {
		return []Finding{unchecked(fmt.Sprintf("the queues bound to exchange %q", exchange), err)}
	}
	var fs []Finding
	for _, name := range queues {
		var q queueInfo
		if err := a.get(ctx, &q, "queues", vhost, name); err != nil {
			if errors.Is(err, errNotFound) {
				continue // deleted since the bindings were read
			}
			fs = append(fs, unchecked(fmt.Sprintf("queue %q", name), err))
			continue
		}
		if f, ok := overflowFinding(vhost, exchange, q); ok {
			fs = append(fs, f)
		}
	}
	summary := fmt.Sprintf("%d queue(s) bound to exchange %q checked for length limits", len(queues), exchange)
	if truncated {
		summary += fmt.Sprintf(" (the first %d; more are bound)", maxBoundQueues)
	}
	if len(queues) == 0 {
		summary = fmt.Sprintf("no queue is bound to exchange %q: the relay's publishes are returned and retried until one is", exchange)
	}
	return append([]Finding{{Check: checkTopology, Message: summary}}, fs...)
}

// boundQueues lists the queues exchange routes to, through
// exchange-to-exchange bindings too, each once and sorted, at most
// maxBoundQueues of them (truncated says there were more).
func (a *managementAPI) boundQueues(ctx context.Context, vhost, exchange string) (queues []string, truncated bool, err error) {
	seenQueue := map[string]bool{}
	seenExchange := map[string]bool{exchange: true}
	todo := []string{exchange}
	for len(todo) > 0 {
		ex := todo[0]
		todo = todo[1:]
		var bs []binding
		if err := a.get(ctx, &bs, "exchanges", vhost, ex, "bindings", "source"); err != nil {
			if ex != exchange && errors.Is(err, errNotFound) {
				continue // a destination exchange deleted meanwhile
			}
			return nil, false, err
		}
		for _, b := range bs {
			switch {
			case b.DestinationType == "exchange" && !seenExchange[b.Destination] && len(seenExchange) < maxExchangeHops:
				seenExchange[b.Destination] = true
				todo = append(todo, b.Destination)
			case b.DestinationType == "queue" && !seenQueue[b.Destination]:
				if len(seenQueue) == maxBoundQueues {
					truncated = true
					continue
				}
				seenQueue[b.Destination] = true
				queues = append(queues, b.Destination)
			}
		}
	}
	slices.Sort(queues)
	return queues, truncated, nil
}

// overflowFinding judges one queue's length limit. A limit comes from the
// queue's arguments or its effective policy (RabbitMQ applies the lower of
// the two); the overflow behaviour from the argument, else the policy, else
// drop-head (the argument wins over a policy for overflow). ok is false for
// a queue without a limit.
func overflowFinding(vhost, exchange string, q queueInfo) (Finding, bool) {
	var limits []string
	for _, l := range []struct{ arg, policy string }{{"x-max-length", "max-length"}, {"x-max-length-bytes", "max-length-bytes"}} {
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
	overflow, from := defaultOverflow, "the default"
	if v, ok := q.EffectivePolicyDefinition["overflow"].(string); ok {
		overflow, from = v, fmt.Sprintf("policy %q", q.Policy)
	}
	if v, ok := q.Arguments["x-overflow"].(string); ok {
		overflow, from = v, "argument x-overflow"
	}
	f := Finding{Check: checkTopology}
	limited := fmt.Sprintf("queue %q, bound to exchange %q, has %s", q.Name, exchange, strings.Join(limits, " and "))
	switch overflow {
	case "reject-publish":
		f.Message = fmt.Sprintf("%s and overflow reject-publish (%s): a full queue nacks and the relay publishes again after a backoff, without loss", limited, from)
	case "reject-publish-dlx":
		f.Message = fmt.Sprintf("%s and overflow reject-publish-dlx (%s): a full queue nacks, and the relay publishes again, without loss; the refused copies also go to the queue's dead-letter exchange, if it routes them", limited, from)
	default:
		f.Severity = Warn
		f.Message = fmt.Sprintf("%s and overflow %s (%s): when it is full the broker acks the relay's publish and silently drops the oldest message, an event the relay counts as delivered", limited, overflow, from)
		how := fmt.Sprintf("a policy (rabbitmqctl set_policy -p %s --apply-to queues <name> '^%s$' '{\"overflow\":\"reject-publish\", …the limits…}')", vhost, regexp.QuoteMeta(q.Name))
		if q.Policy != "" {
			// One policy applies to a queue: a new one would replace it.
			how = fmt.Sprintf("policy %q (add \"overflow\":\"reject-publish\" to its definition)", q.Policy)
		}
		if _, ok := q.Arguments["x-overflow"]; ok {
			// The argument wins over any policy for overflow.
			how = "the queue's x-overflow argument (delete and redeclare the queue; a policy cannot override it)"
		}
		f.Remedy = fmt.Sprintf("make a full queue refuse new messages instead: set overflow to reject-publish in %s; the broker then nacks and the relay publishes again after a backoff, without loss. reject-publish-dlx keeps every event too, and also dead-letters the refused copies", how)
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
