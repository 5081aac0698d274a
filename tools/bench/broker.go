package main

// Which broker the bench measures against, and what that broker is. Every
// figure of the report is relative to this broker's own ceiling, so two
// reports are comparable only when they name the same product and version:
// the report says both, and the URL without its password.

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"unicode"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/svckit/brokernode"
)

// benchAMQPURLEnv names the broker for `make bench`, which passes the
// caller's environment through; -amqp-url overrides it for a single run.
const benchAMQPURLEnv = "BENCH_AMQP_URL"

// brokerChoice is the broker URL and where it came from, so that the report
// can say why this broker was used (a stale variable in a shell is the usual
// surprise).
type brokerChoice struct {
	url  string
	from string // "-amqp-url", "$BENCH_AMQP_URL", "$CDCRELAY_TEST_AMQP_URL" or "default"
}

// chooseBroker picks the broker URL: the -amqp-url flag when given, else
// $BENCH_AMQP_URL, else what the tests use ($CDCRELAY_TEST_AMQP_URL or the
// local guest account), the bench's broker before the flag existed. It
// validates the pick; its errors never quote the URL, which may carry a
// password. getenv is os.Getenv outside the tests.
func chooseBroker(flagValue string, flagSet bool, getenv func(string) string) (brokerChoice, error) {
	var c brokerChoice
	switch {
	case flagSet:
		// An explicit empty flag is a mistake (an unset shell variable in
		// -amqp-url=$X), not a request for the default.
		c = brokerChoice{url: flagValue, from: "-amqp-url"}
	case getenv(benchAMQPURLEnv) != "":
		c = brokerChoice{url: getenv(benchAMQPURLEnv), from: "$" + benchAMQPURLEnv}
	case getenv(brokernode.AMQPURLEnv) != "":
		c = brokerChoice{url: getenv(brokernode.AMQPURLEnv), from: "$" + brokernode.AMQPURLEnv}
	default:
		c = brokerChoice{url: brokernode.DefaultAMQPURL, from: "default"}
	}
	if err := validateAMQPURL(c.url); err != nil {
		return brokerChoice{}, fmt.Errorf("%s: %w", c.from, err)
	}
	return c, nil
}

// errAMQPURLShape ends every validation error: it shows the expected form
// with placeholders, since the URL itself is never echoed.
var errAMQPURLShape = errors.New("want amqp://user:password@host:port/vhost or amqps://…, one node, " +
	"with reserved characters in user and password percent-encoded")

// validateAMQPURL rejects what the bench cannot dial, before it starts a
// PostgreSQL cluster for nothing. Its messages name what is wrong but quote
// no part of the URL: a parse error from net/url carries the whole URL and
// an escape error a piece of it, either of which can be the password.
func validateAMQPURL(raw string) error {
	if raw == "" {
		return fmt.Errorf("empty AMQP URL: %w", errAMQPURLShape)
	}
	if strings.IndexFunc(raw, unicode.IsSpace) >= 0 {
		return fmt.Errorf("invalid AMQP URL: it contains whitespace: %w", errAMQPURLShape)
	}
	if strings.Contains(raw, "#") || strings.Count(raw, "@") > 1 {
		// Both split an unescaped password in the wrong place: net/url
		// would complain about a port that is really part of the password,
		// or the dial fail as a refused login, far from the cause.
		return fmt.Errorf("invalid AMQP URL: an unescaped '#' or '@': %w", errAMQPURLShape)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("invalid AMQP URL: %s: %w", parseReason(raw, err), errAMQPURLShape)
	}
	switch {
	case u.Scheme != "amqp" && u.Scheme != "amqps":
		// Not even the scheme is quoted: in "user:pass@host" it is the user.
		return fmt.Errorf("invalid AMQP URL: the scheme is not amqp or amqps: %w", errAMQPURLShape)
	case u.Opaque != "" || u.Hostname() == "":
		return fmt.Errorf("invalid AMQP URL: no host: %w", errAMQPURLShape)
	case strings.Contains(u.Host, ","):
		// The relay takes several nodes, but the bench's own publisher and
		// consumer dial one, and the ceiling is one node's.
		return fmt.Errorf("invalid AMQP URL: several nodes: %w", errAMQPURLShape)
	}
	if p := u.Port(); p != "" {
		// net/url takes any digits and amqp091-go any int32: 99999 would
		// fail only at the dial, as an unreachable broker.
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("invalid AMQP URL: the port is not in 1..65535: %w", errAMQPURLShape)
		}
	}
	if _, err := amqp.ParseURI(raw); err != nil {
		// The URL parsed, so what is left is a query parameter (heartbeat,
		// channel_max, …); its complaint quotes the value, which is not
		// the password, but is scrubbed of it all the same.
		msg := err.Error()
		if pw, ok := u.User.Password(); ok && pw != "" {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
		return fmt.Errorf("invalid AMQP URL: %s: %w", msg, errAMQPURLShape)
	}
	return nil
}

// parseReason is net/url's complaint without the URL it quotes; when the
// URL has a userinfo the complaint may quote a piece of the password too
// (an escape error quotes the bad escape), so it is left out.
func parseReason(raw string, err error) string {
	if strings.Contains(raw, "@") {
		return "not a URL"
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return "not a URL (" + ue.Err.Error() + ")"
	}
	return "not a URL"
}

// redactedURL is the URL as the report shows it: the password replaced,
// the user kept (guest against a real account is worth seeing).
func redactedURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<invalid AMQP URL>"
	}
	return u.Redacted()
}

// probeBroker dials the broker once and returns what it says it is, from
// the connection.start properties of the handshake.
func probeBroker(ctx context.Context, rawURL string) (string, error) {
	conn, err := brokernode.DialAMQP(ctx, rawURL)
	if err != nil {
		return "", err
	}
	name := brokerName(conn.Properties)
	if err := conn.Close(); err != nil {
		return "", fmt.Errorf("close the broker connection: %w", err)
	}
	return name, nil
}

// brokerName formats a broker's server properties as "RabbitMQ 4.1.0". A
// missing field is said to be missing rather than dropped, so that a report
// without a version is not mistaken for one of a known broker.
func brokerName(props amqp.Table) string {
	product, version := propString(props, "product"), propString(props, "version")
	switch {
	case product == "" && version == "":
		return "unknown broker (no product or version in its handshake)"
	case product == "":
		return "unknown product " + version
	case version == "":
		return product + " (version not reported)"
	}
	return product + " " + version
}

// propString reads a string property; the broker sends them as long
// strings, which amqp091-go may hand over as string or []byte. What the
// broker sent goes into a one-line report, so control characters are
// dropped.
func propString(props amqp.Table, key string) string {
	var s string
	switch v := props[key].(type) {
	case string:
		s = v
	case []byte:
		s = string(v)
	}
	return strings.TrimSpace(strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, s))
}

// brokerLine heads the report (and its progress lines): which broker, where,
// and what chose it.
func brokerLine(m machineInfo) string {
	return fmt.Sprintf("broker:     %s at %s (from %s)\n", m.broker, m.brokerAt, m.brokerBy)
}
