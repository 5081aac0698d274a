package preflight

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// brokerChecks connects to every broker node of CDCRELAY_AMQP_URL (one or
// several, checked in parallel) and checks the exchange passively on each
// (declaring nothing). Each node's check, handshake and every reply, ends
// by opts.Timeout: a black-holed node is a finding, not a hang. With
// several nodes every finding names its node; a node that cannot be
// reached is an Error only when no node can: the relay skips it.
func brokerChecks(ctx context.Context, cfg config.Config, opts Options) []Finding {
	if cfg.AMQPURL == "" {
		return []Finding{{Check: checkBroker, Severity: Error, Message: "CDCRELAY_AMQP_URL is not set: `cdcrelay run` needs the broker",
			Remedy: "set CDCRELAY_AMQP_URL (or CDCRELAY_AMQP_URL_FILE)"}}
	}
	nodes, err := config.ParseAMQPURL(cfg.AMQPURL)
	if err != nil {
		return []Finding{{Check: checkBroker, Severity: Error, Message: fmt.Sprintf("CDCRELAY_AMQP_URL is not a valid AMQP URL: %v", err),
			Remedy: "use amqp://user:password@host:5672/vhost or amqps://… (several nodes as host1:5672,host2:5672), with reserved characters in the password percent-encoded"}}
	}
	// The CA and client certificate run uses: without them check would
	// fail against a broker signed by a private CA that run accepts.
	tlsConfig, err := cfg.AMQPTLS()
	if err != nil {
		return []Finding{{Check: checkBroker, Severity: Error, Message: fmt.Sprintf("broker TLS files: %v", err),
			Remedy: "point CDCRELAY_AMQP_TLS_CA, CDCRELAY_AMQP_TLS_CERT and CDCRELAY_AMQP_TLS_KEY at readable PEM files"}}
	}
	results := make([]nodeResult, len(nodes))
	var wg sync.WaitGroup
	for i, node := range nodes {
		wg.Go(func() { results[i] = brokerNodeChecks(ctx, cfg, node, tlsConfig, opts) })
	}
	wg.Wait()
	if len(nodes) == 1 {
		return results[0].findings
	}
	anyConnected := false
	for _, r := range results {
		anyConnected = anyConnected || r.connected
	}
	var fs []Finding
	for i, r := range results {
		label := fmt.Sprintf("node %d of %d (%s): ", i+1, len(nodes), config.AMQPNodeAddr(nodes[i]))
		for _, f := range r.findings {
			if r.unreachable && anyConnected {
				f.Severity = Warn
				f.Remedy += "; meanwhile the relay connects to the other nodes"
			}
			f.Message = label + f.Message
			fs = append(fs, f)
		}
	}
	return fs
}

// nodeResult is what the check found on one broker node.
type nodeResult struct {
	findings    []Finding
	connected   bool
	unreachable bool // the connection failed below AMQP (refused, timed out, TLS)
}

// brokerNodeChecks connects to one node (a single-host URL) and checks the
// exchanges there, all within opts.Timeout.
func brokerNodeChecks(ctx context.Context, cfg config.Config, node string, tlsConfig *tls.Config, opts Options) nodeResult {
	uri, err := amqp.ParseURI(node)
	if err != nil { // config.ParseAMQPURL checked it; the error would quote the password
		return nodeResult{findings: []Finding{{Check: checkBroker, Severity: Error, Message: "not a valid AMQP URL",
			Remedy: "use amqp://user:password@host:5672/vhost or amqps://…, with reserved characters in the password percent-encoded"}}}
	}
	where := config.Redact(node)
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()

	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(checkApplicationName)
	conn, err := amqp.DialConfig(node, amqp.Config{
		Properties:      props,
		Locale:          "en_US",
		TLSClientConfig: tlsConfig,
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			dc := &deadlineConn{Conn: c, deadline: deadline}
			if err := dc.SetDeadline(time.Time{}); err != nil {
				_ = c.Close()
				return nil, err
			}
			return dc, nil
		},
	})
	if err != nil {
		var aerr *amqp.Error
		return nodeResult{findings: []Finding{brokerDialFailed(where, uri, err)}, unreachable: !errors.As(err, &aerr)}
	}
	defer func() { _ = conn.Close() }() // bounded by the deadline too

	version, _ := conn.Properties["version"].(string)
	product, _ := conn.Properties["product"].(string)
	fs := []Finding{{Check: checkBroker, Message: fmt.Sprintf("connected to %s (%s %s)", where, product, version)}}
	exists := checkExchangeExists(conn, cfg.Exchange, uri, "CDCRELAY_EXCHANGE")
	fs = append(fs, exists)
	var dlx Finding
	if cfg.DeadLetterExchange != "" {
		// run checks it at every connect too, and does not start without it.
		dlx = checkExchangeExists(conn, cfg.DeadLetterExchange, uri, "CDCRELAY_DEAD_LETTER_EXCHANGE")
		fs = append(fs, dlx)
	}
	// Permissions on an exchange that exists: a missing one is its own
	// Error already. The default exchange takes no binding to probe with.
	if cfg.Exchange != "" && exists.Severity == OK {
		fs = append(fs, checkWritePermission(conn, uri, cfg.Exchange, "CDCRELAY_EXCHANGE"), checkTailPermissions(conn, uri, cfg.Exchange))
	}
	if cfg.DeadLetterExchange != "" && dlx.Severity == OK {
		fs = append(fs, checkWritePermission(conn, uri, cfg.DeadLetterExchange, "CDCRELAY_DEAD_LETTER_EXCHANGE"))
	}
	fs = append(fs, checkBrokerMaxMessageSize(ctx, conn, cfg)) // last: a probe cut off by the deadline ends the connection
	return nodeResult{findings: fs, connected: true}
}

func brokerDialFailed(where string, uri amqp.URI, err error) Finding {
	f := Finding{Check: checkBroker, Severity: Error, Message: fmt.Sprintf("cannot connect to %s: %v", where, err)}
	var aerr *amqp.Error
	switch {
	case errors.As(err, &aerr) && aerr.Code == amqp.AccessRefused:
		f.Remedy = fmt.Sprintf("check the user (%s) and password in CDCRELAY_AMQP_URL", uri.Username)
	case errors.As(err, &aerr) && aerr.Code == amqp.NotAllowed && strings.HasSuffix(aerr.Reason, " not found"):
		// No permission can be set on a vhost that is not there.
		f.Remedy = fmt.Sprintf("vhost %q does not exist on this broker: correct the vhost, the path of CDCRELAY_AMQP_URL (%%2F for the default vhost /), or create it (rabbitmqctl add_vhost %s) and give user %s access to it", uri.Vhost, uri.Vhost, uri.Username)
	case errors.As(err, &aerr) && aerr.Code == amqp.NotAllowed:
		f.Remedy = fmt.Sprintf("give user %s access to vhost %q (rabbitmqctl set_permissions -p %s %s …), or check its connection limits", uri.Username, uri.Vhost, uri.Vhost, uri.Username)
	case errors.As(err, &aerr):
		f.Remedy = "see the broker's log for why it closed the connection"
	default:
		f.Remedy = fmt.Sprintf("check that RabbitMQ runs and is reachable at %s:%d (firewall, DNS, TLS for amqps)", uri.Host, uri.Port)
	}
	return f
}

// checkExchangeExists checks exchange passively; variable is the
// CDCRELAY_ variable that names it.
func checkExchangeExists(conn *amqp.Connection, exchange string, uri amqp.URI, variable string) Finding {
	f := Finding{Check: checkExchange}
	if exchange == "" {
		f.Message = "the default exchange (CDCRELAY_EXCHANGE is empty): routing keys are queue names"
		return f
	}
	ch, err := conn.Channel()
	if err != nil {
		return Finding{Check: checkExchange, Severity: Error, Message: fmt.Sprintf("could not open a channel to check exchange %q: %v", exchange, err),
			Remedy: "check the broker's channel limits and log"}
	}
	// A failed passive declare closes the channel; it is this check's own.
	err = ch.ExchangeDeclarePassive(exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	var aerr *amqp.Error
	switch {
	case err == nil:
		_ = ch.Close()
		f.Message = fmt.Sprintf("exchange %q exists on vhost %q", exchange, uri.Vhost)
	case errors.As(err, &aerr) && aerr.Code == amqp.NotFound:
		f.Severity = Error
		f.Message = fmt.Sprintf("exchange %q does not exist on vhost %q: the relay does not declare topology and will not start", exchange, uri.Vhost)
		f.Remedy = fmt.Sprintf("declare it durable in your broker definitions (e.g. rabbitmqadmin -V %s declare exchange name=%s type=topic durable=true), or set %s", uri.Vhost, exchange, variable)
	case errors.As(err, &aerr) && aerr.Code == amqp.AccessRefused:
		f.Severity = Error
		f.Message = fmt.Sprintf("user %s may not use exchange %q: %v", uri.Username, exchange, err)
		f.Remedy = fmt.Sprintf("grant write permission on the exchange: rabbitmqctl set_permissions -p %s %s <configure> '^%s$' <read>", uri.Vhost, uri.Username, exchange)
	default:
		f.Severity = Error
		f.Message = fmt.Sprintf("could not check exchange %q: %v", exchange, err)
		f.Remedy = "check that the broker answers (it may be blocked or overloaded) and retry"
	}
	return f
}

// deadlineConn pins every deadline to one instant: amqp091-go clears the
// handshake deadline once the connection is open, and would otherwise wait
// forever for a reply from a broker that stopped answering.
type deadlineConn struct {
	net.Conn
	deadline time.Time
}

func (c *deadlineConn) pin(t time.Time) time.Time {
	if t.IsZero() || t.After(c.deadline) {
		return c.deadline
	}
	return t
}

func (c *deadlineConn) SetDeadline(t time.Time) error { return c.Conn.SetDeadline(c.pin(t)) }
func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.pin(t))
}
func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	return c.Conn.SetWriteDeadline(c.pin(t))
}
