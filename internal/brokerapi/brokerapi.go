// Package brokerapi is a small client of RabbitMQ's management HTTP API:
// the bindings, exchanges and queues that AMQP 0.9.1 cannot list. `check`
// reads the topology with it and `tail` copies the exchange's bindings
// with it. It only reads.
package brokerapi

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Variable is the optional setting that names the management API.
const Variable = "CDCRELAY_AMQP_MANAGEMENT_URL"

// TailQueuePrefix starts the name of every queue `cdcrelay tail`
// declares, and TailQueuePattern is the permission regex that covers them:
// check probes tail's permissions on such a name, and tail never copies
// the bindings of such a queue.
const (
	TailQueuePrefix  = "cdcrelay.tail."
	TailQueuePattern = `^cdcrelay\.tail\.`
)

// ErrNotFound is a 404: the vhost, exchange or queue does not exist.
var ErrNotFound = errors.New("not found")

// ErrForbidden is a 401 or 403: the user lacks a tag or access to the vhost.
var ErrForbidden = errors.New("the user needs the management or monitoring tag and access to the vhost")

// Client reads the management API at one base URL.
type Client struct {
	base       string // scheme://host:port[/path_prefix], without the credentials
	where      string // the URL redacted, for messages
	user, pass string
	http       *http.Client
}

// New parses raw (http[s]://user:password@host:port[/prefix]). tlsConfig,
// if not nil, is used for https: the management listener is usually signed
// by the CA the AMQP listener is, and the client certificate goes along for
// brokers that require one on both. redacted is raw as messages may show it.
func New(raw, redacted string, tlsConfig *tls.Config) (*Client, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return nil, errors.New("not a valid URL") // url.Error quotes the URL, password included
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("want http:// or https://host:port, got scheme %q", u.Scheme)
	}
	c := &Client{where: redacted, http: &http.Client{}}
	if u.User != nil {
		c.user = u.User.Username()
		c.pass, _ = u.User.Password()
	}
	if u.Scheme == "https" {
		if tlsConfig == nil {
			tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		c.http.Transport = &http.Transport{TLSClientConfig: tlsConfig, Proxy: http.ProxyFromEnvironment}
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	c.base = strings.TrimSuffix(u.String(), "/")
	return c, nil
}

// Get decodes the JSON answer to GET base/api/<segments…>, each segment
// path-escaped (a vhost "/" is %2F).
func (c *Client) Get(ctx context.Context, out any, segments ...string) error {
	path := "/api"
	for _, s := range segments {
		path += "/" + url.PathEscape(s)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	if c.user != "" {
		req.SetBasicAuth(c.user, c.pass)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s from %s: %w", path, c.where, err)
	}
	defer func() { _ = resp.Body.Close() }()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("GET %s: %w", path, ErrNotFound)
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("GET %s from %s: %s: %w", path, c.where, resp.Status, ErrForbidden)
	case resp.StatusCode != http.StatusOK:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return fmt.Errorf("GET %s from %s: %s %s", path, c.where, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("GET %s from %s: decode the answer (is it the management API?): %w", path, c.where, err)
	}
	return nil
}

// Binding is one entry of /api/exchanges/<vhost>/<name>/bindings/source.
type Binding struct {
	Source          string         `json:"source"`
	Destination     string         `json:"destination"`
	DestinationType string         `json:"destination_type"` // "queue" or "exchange"
	RoutingKey      string         `json:"routing_key"`
	Arguments       map[string]any `json:"arguments"`
}

// Exchange is the part of /api/exchanges/<vhost>/<name> the callers read.
type Exchange struct {
	Name      string         `json:"name"`
	Type      string         `json:"type"`
	Arguments map[string]any `json:"arguments"`
	Policy    string         `json:"policy"`
	// EffectivePolicyDefinition is absent on brokers that do not report it.
	EffectivePolicyDefinition map[string]any `json:"effective_policy_definition"`
}

// Queue is the part of /api/queues/<vhost>/<name> the callers read.
type Queue struct {
	Name      string         `json:"name"`
	Type      string         `json:"type"`
	Durable   bool           `json:"durable"`
	Exclusive bool           `json:"exclusive"`
	Arguments map[string]any `json:"arguments"`
	// EffectivePolicyDefinition is the policy and operator policy merged,
	// as the queue applies them.
	EffectivePolicyDefinition map[string]any `json:"effective_policy_definition"`
	Policy                    string         `json:"policy"`
}

// Bindings lists the bindings whose source is exchange.
func (c *Client) Bindings(ctx context.Context, vhost, exchange string) ([]Binding, error) {
	var bs []Binding
	if err := c.Get(ctx, &bs, "exchanges", vhost, exchange, "bindings", "source"); err != nil {
		return nil, err
	}
	return bs, nil
}

// Exchange reads one exchange.
func (c *Client) Exchange(ctx context.Context, vhost, name string) (Exchange, error) {
	var ex Exchange
	err := c.Get(ctx, &ex, "exchanges", vhost, name)
	return ex, err
}

// Queue reads one queue.
func (c *Client) Queue(ctx context.Context, vhost, name string) (Queue, error) {
	var q Queue
	err := c.Get(ctx, &q, "queues", vhost, name)
	return q, err
}

// Policy is one entry of /api/policies/<vhost>. A user with the monitoring
// or management tag may list a vhost's policies but not read one by name
// (/api/policies/<vhost>/<name> needs the policymaker tag), and an
// exchange's answer names its policy without its definition: the list is
// how such a user learns an exchange's alternate exchange set by policy.
type Policy struct {
	Name       string         `json:"name"`
	Pattern    string         `json:"pattern"`
	ApplyTo    string         `json:"apply-to"`
	Definition map[string]any `json:"definition"`
	Priority   int            `json:"priority"`
}

// Policies lists the policies of vhost.
func (c *Client) Policies(ctx context.Context, vhost string) ([]Policy, error) {
	var ps []Policy
	if err := c.Get(ctx, &ps, "policies", vhost); err != nil {
		return nil, err
	}
	return ps, nil
}

// DeprecatedFeature is one entry of /api/deprecated-features/used
// (RabbitMQ 3.13 and later): a deprecated feature something on the broker
// uses. RabbitMQ 4.3 answers name, deprecation_phase, desc (often empty),
// doc_url (empty for some) and provided_by.
type DeprecatedFeature struct {
	Name string `json:"name"`
	// DeprecationPhase is permitted_by_default, denied_by_default,
	// disconnected or removed.
	DeprecationPhase string `json:"deprecation_phase"`
	Desc             string `json:"desc"`
	DocURL           string `json:"doc_url"`
	ProvidedBy       string `json:"provided_by"`
}

// DeprecatedFeaturesUsed lists the deprecated features in use on the
// broker. A broker before RabbitMQ 3.13 has no such endpoint: the error is
// then ErrNotFound.
func (c *Client) DeprecatedFeaturesUsed(ctx context.Context) ([]DeprecatedFeature, error) {
	var fs []DeprecatedFeature
	if err := c.Get(ctx, &fs, "deprecated-features", "used"); err != nil {
		return nil, err
	}
	return fs, nil
}
