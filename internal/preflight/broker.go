package preflight

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// brokerChecks connects to the broker and checks the exchange passively
// (declaring nothing). The whole check, handshake and every reply, ends by
// opts.Timeout: a black-holed broker is an Error finding, not a hang.
func brokerChecks(ctx context.Context, cfg config.Config, opts Options) []Finding {
	if cfg.AMQPURL == "" {
		return []Finding{{Check: checkBroker, Severity: Error, Message: "CDCRELAY_AMQP_URL is not set: `cdcrelay run` needs the broker",
			Remedy: "set CDCRELAY_AMQP_URL (or CDCRELAY_AMQP_URL_FILE)"}}
	}
	uri, err := amqp.ParseURI(cfg.AMQPURL)
	if err != nil {
		return []Finding{{Check: checkBroker, Severity: Error, Message: fmt.Sprintf("CDCRELAY_AMQP_URL is not a valid AMQP URL: %v", err),
			Remedy: "use amqp://user:password@host:5672/vhost or amqps://…, with reserved characters in the password percent-encoded"}}
	}
	where := config.Redact(cfg.AMQPURL)
	// The CA and client certificate run uses: without them check would
	// fail against a broker signed by a private CA that run accepts.
	tlsConfig, err := cfg.AMQPTLS()
	if err != nil {
		return []Finding{{Check: checkBroker, Severity: Error, Message: fmt.Sprintf("broker TLS files: %v", err),
			Remedy: "point CDCRELAY_AMQP_TLS_CA, CDCRELAY_AMQP_TLS_CERT and CDCRELAY_AMQP_TLS_KEY at readable PEM files"}}
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()

	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(checkApplicationName)
	conn, err := amqp.DialConfig(cfg.AMQPURL, amqp.Config{
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
		return []Finding{brokerDialFailed(where, uri, err)}
	}
	defer func() { _ = conn.Close() }() // bounded by the deadline too

	version, _ := conn.Properties["version"].(string)
	product, _ := conn.Properties["product"].(string)
	fs := []Finding{{Check: checkBroker, Message: fmt.Sprintf("connected to %s (%s %s)", where, product, version)}}
	fs = append(fs, checkExchangeExists(conn, cfg.Exchange, uri, "CDCRELAY_EXCHANGE"))
	if cfg.DeadLetterExchange != "" {
		// run checks it at every connect too, and does not start without it.
		fs = append(fs, checkExchangeExists(conn, cfg.DeadLetterExchange, uri, "CDCRELAY_DEAD_LETTER_EXCHANGE"))
	}
	fs = append(fs, checkBrokerMaxMessageSize(ctx, conn, cfg)) // last: a probe cut off by the deadline ends the connection
	return fs
}

func brokerDialFailed(where string, uri amqp.URI, err error) Finding {
	f := Finding{Check: checkBroker, Severity: Error, Message: fmt.Sprintf("cannot connect to %s: %v", where, err)}
	var aerr *amqp.Error
	switch {
	case errors.As(err, &aerr) && aerr.Code == amqp.AccessRefused:
		f.Remedy = fmt.Sprintf("check the user (%s) and password in CDCRELAY_AMQP_URL", uri.Username)
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
