package config

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// CDCRELAY_AMQP_URL may name several broker nodes, as libpq's URLs do:
// amqp://user:password@host1:5672,host2:5672,[::1]:5673/vhost?params. The
// nodes share the scheme, the credentials, the vhost and the parameters;
// a host without a port takes the scheme's (5672, or 5671 for amqps).
// amqp091-go dials one URL, so the relay splits the list into one ordinary
// URL per node (AMQPNodes) and picks among them itself.

// amqpDefaultPorts are the ports a node without one takes, by scheme.
var amqpDefaultPorts = map[string]int{"amqp": 5672, "amqps": 5671}

// amqpHost is one node of the host list: a name or an IPv4 address, or an
// IPv6 address in brackets (with an optional %25-escaped zone), each with
// an optional :port. It never holds '@', '/', '?', '#' or ',', so a list
// that matches it cannot have swallowed a piece of the password.
var amqpHost = regexp.MustCompile(`^(\[[0-9A-Fa-f:.]+(%25[A-Za-z0-9._~%-]+)?\]|[A-Za-z0-9._~%-]+)(:[0-9]*)?$`)

// amqpURLParts is a URL split around its host list.
type amqpURLParts struct {
	scheme   string // lower case, without "://"
	userinfo string // as written, with its trailing '@'; "" when none
	hosts    []string
	rest     string // the path and query as written, from the first '/' or '?'
}

// splitAMQPURL splits a URL around its host list the way net/url (and so
// amqp091-go) reads a URL: the authority runs to the first '/' or '?', and
// the userinfo ends at its last '@'. It does not judge the parts.
func splitAMQPURL(s string) (amqpURLParts, bool) {
	scheme, p, ok := strings.Cut(s, "://")
	if !ok {
		return amqpURLParts{}, false
	}
	parts := amqpURLParts{scheme: strings.ToLower(scheme)}
	authority := p
	if i := strings.IndexAny(p, "/?"); i >= 0 {
		authority, parts.rest = p[:i], p[i:]
	}
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		parts.userinfo, authority = authority[:i+1], authority[i+1:]
	}
	parts.hosts = strings.Split(authority, ",")
	return parts, true
}

// node is the single-host URL of host.
func (p amqpURLParts) node(host string) string {
	return p.scheme + "://" + p.userinfo + host + p.rest
}

// errAMQPURLShape is the advice every malformed URL gets. No part of the
// URL is quoted: a password with an unescaped '/', '?' or '@' ends up in
// the part a message would quote.
var errAMQPURLShape = errors.New("want amqp://user:password@host:port/vhost or amqps://…, several nodes as host1:port1,host2:port2 " +
	"(an IPv6 address in brackets); percent-encode reserved characters in the user and password")

// ParseAMQPURL splits an AMQP URL that may list several nodes into one
// single-host URL per node, in the order written. A URL with one host is
// returned as it is; in a list, a host without a port gets the scheme's.
// Errors never quote the URL: it holds a password.
func ParseAMQPURL(raw string) ([]string, error) {
	if strings.ContainsAny(raw, " \t\r\n") {
		return nil, errors.New("must not contain white space (" + errAMQPURLShape.Error() + ")")
	}
	if strings.Contains(raw, "#") {
		return nil, errors.New("holds a '#': percent-encode it (%23) in the password")
	}
	parts, ok := splitAMQPURL(raw)
	if !ok {
		return nil, errAMQPURLShape
	}
	defPort, ok := amqpDefaultPorts[parts.scheme]
	if !ok {
		return nil, errors.New("the scheme must be amqp:// or amqps://")
	}
	if strings.Count(parts.userinfo, "@") > 1 {
		return nil, errors.New("holds more than one '@' before the host: percent-encode an '@' in the user or password (%40)")
	}
	nodes := make([]string, 0, len(parts.hosts))
	for i, host := range parts.hosts {
		where := "the host"
		if len(parts.hosts) > 1 {
			where = fmt.Sprintf("host %d of %d", i+1, len(parts.hosts))
		}
		if err := checkAMQPHost(host); err != nil {
			return nil, fmt.Errorf("%s: %w (%w)", where, err, errAMQPURLShape)
		}
		if name, port := splitAMQPHost(host); port == "" && len(parts.hosts) > 1 {
			host = name + ":" + strconv.Itoa(defPort)
		}
		node := parts.node(host)
		if len(parts.hosts) == 1 {
			node = raw
		}
		// The library's own parser has the last word: what it rejects,
		// the relay could not dial. Its error quotes the URL: not shown.
		if _, err := amqp.ParseURI(node); err != nil {
			return nil, fmt.Errorf("%s: amqp091-go cannot read the URL of this node (%w)", where, errAMQPURLShape)
		}
		nodes = append(nodes, node)
	}
	return nodes, nil
}

// checkAMQPHost judges one host of the list.
func checkAMQPHost(host string) error {
	if host == "" {
		return errors.New("empty")
	}
	if !amqpHost.MatchString(host) {
		return errors.New("not a host name, an IPv4 address or an [IPv6] address, with an optional :port")
	}
	if _, port := splitAMQPHost(host); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return errors.New("the port is outside 1..65535")
		}
	}
	return nil
}

// splitAMQPHost splits a host of the list (matching amqpHost) into its
// name and its port ("" when it names none).
func splitAMQPHost(host string) (name, port string) {
	end := 0
	if strings.HasPrefix(host, "[") {
		end = strings.IndexByte(host, ']') + 1 // the colons inside are the address's
	}
	if i := strings.IndexByte(host[end:], ':'); i >= 0 {
		return host[:end+i], host[end+i+1:]
	}
	return host, ""
}

// AMQPNodes returns one single-host URL per node of CDCRELAY_AMQP_URL, in
// the order written (the relay shuffles them); nil when the URL is empty or
// invalid (Load reports that).
func (c *Config) AMQPNodes() []string {
	if c.AMQPURL == "" {
		return nil
	}
	nodes, err := ParseAMQPURL(c.AMQPURL)
	if err != nil {
		return nil
	}
	return nodes
}

// AMQPNodeAddr returns the host:port of a single-host AMQP URL, the scheme's
// port when it names none: what the relay logs of the node it connects to,
// never the credentials. "" when the URL does not parse.
func AMQPNodeAddr(nodeURL string) string {
	u, err := amqp.ParseURI(nodeURL)
	if err != nil {
		return ""
	}
	return net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
}

// checkAMQPURL returns the problems of CDCRELAY_AMQP_URL, each naming it:
// its shape, and its scheme when TLS files are set.
func (c *Config) checkAMQPURL() []string {
	if c.AMQPURL == "" {
		return nil // only run needs it: see RequireBroker
	}
	if _, err := ParseAMQPURL(c.AMQPURL); err != nil {
		return []string{fmt.Sprintf("%sAMQP_URL: %v", Prefix, err)}
	}
	if (c.AMQPTLSCA != "" || c.AMQPTLSCert != "") && !strings.EqualFold(strings.SplitN(c.AMQPURL, "://", 2)[0], "amqps") {
		return []string{Prefix + "AMQP_URL: TLS files are set but the URL is not amqps://"}
	}
	return nil
}
