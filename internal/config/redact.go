package config

import (
	"errors"
	"net/url"
	"regexp"
	"strings"
)

// Redaction keeps only an allow-list of a connection string's parts: the
// scheme, the user, the hosts and ports, the database or vhost, and the
// parameters named below, which are never secret. Every other parameter
// (password, sslpassword, and any this list does not know) keeps its name
// with its value replaced, and a string whose parts cannot be told apart
// with certainty is not shown at all: a parser that guesses wrong prints a
// piece of a password as a host.

// redacted replaces a hidden value.
const redacted = "xxxxx"

// unparseable stands for a connection string that is not shown.
const unparseable = "(unparseable connection string)"

// safePostgresParams are libpq / pgx parameters whose values are never
// secret: they say where to connect and how, never with what credential.
var safePostgresParams = setOf(
	"host", "hostaddr", "port", "user", "dbname", "database",
	"sslmode", "sslrootcert", "sslcert", "sslkey", "sslcertmode", "sslnegotiation", "sslsni",
	"application_name", "fallback_application_name", "connect_timeout", "target_session_attrs",
	"load_balance_hosts", "channel_binding", "gssencmode", "krbsrvname", "krbspn", "require_auth",
	"min_protocol_version", "max_protocol_version", "client_encoding",
	"keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
	"statement_cache_capacity", "description_cache_capacity", "default_query_exec_mode",
)

// safeAMQPParams are the AMQP URI query parameters (RabbitMQ's URI spec and
// amqp091-go) whose values are never secret; the TLS ones are file paths.
var safeAMQPParams = setOf(
	"heartbeat", "connection_timeout", "channel_max", "frame_max", "auth_mechanism", "locale",
	"server_name_indication", "cacertfile", "certfile", "keyfile", "verify", "fail_if_no_peer_cert",
)

// secretParams hold passwords; Secrets returns their values.
var secretParams = setOf("password", "sslpassword")

// paramName is a parameter name shown with its value hidden; any other
// name (it might itself be a mistyped secret) is dropped with its value.
var paramName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

func setOf(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// Redact returns a connection string fit for logs and error messages: a
// PostgreSQL URL or key=value string, or an AMQP URL, with only its
// allow-listed parts (see above).
func Redact(dsn string) string {
	s := strings.TrimSpace(dsn)
	switch {
	case strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://"):
		return redactPostgresURL(s)
	case strings.Contains(s, "://"):
		return redactURL(s)
	default:
		return redactKeywordValue(s)
	}
}

// Secrets returns the passwords in a connection string, as written and
// decoded, for scrubbing them from text that may quote them: the URL's
// userinfo password and the values of password and sslpassword parameters.
func Secrets(dsn string) []string {
	var out []string
	add := func(raw string) {
		if raw == "" {
			return
		}
		out = append(out, raw)
		if dec, err := url.PathUnescape(raw); err == nil && dec != raw {
			out = append(out, dec)
		}
		if dec, err := url.QueryUnescape(raw); err == nil && dec != raw {
			out = append(out, dec)
		}
	}
	s := strings.TrimSpace(dsn)
	if !strings.Contains(s, "://") {
		pairs, _ := keywordValues(s) // what parsed before an error
		for _, kv := range pairs {
			if secretParams[kv.key] {
				add(kv.value)
			}
		}
		return out
	}
	_, rest, _ := strings.Cut(s, "://")
	// Every way a URL parser may split it: up to the first '@' before a '/'
	// (libpq, pgx), or the last '@' of the authority (net/url).
	if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
		if _, pw, ok := strings.Cut(rest[:i], ":"); ok {
			add(pw)
		}
	}
	authority, _, _ := strings.Cut(rest, "/")
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		if _, pw, ok := strings.Cut(authority[:i], ":"); ok {
			add(pw)
		}
	}
	if _, query, ok := strings.Cut(rest, "?"); ok {
		for _, pair := range strings.Split(query, "&") {
			k, v, _ := strings.Cut(pair, "=")
			if k, err := url.PathUnescape(strings.TrimSpace(k)); err == nil && secretParams[k] {
				add(v)
			}
		}
	}
	return out
}

// redactPostgresURL splits the URL as pgx and libpq do: the userinfo ends
// at the first '@' met before any '/', the hosts run to the first '/' or
// '?', the database to the '?', and parameters are '&'-separated key=value
// pairs.
func redactPostgresURL(s string) string {
	scheme, p, _ := strings.Cut(s, "://")
	var b strings.Builder
	b.WriteString(scheme + "://")
	if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
		user, _, hasPassword := strings.Cut(p[:i], ":")
		p = p[i+1:]
		// A user holding URL syntax means the string was not meant to be
		// split here (a password with an unescaped '@', say).
		if strings.ContainsAny(user, "?&=#@") {
			return unparseable
		}
		b.WriteString(user)
		if hasPassword {
			b.WriteString(":" + redacted)
		}
		b.WriteString("@")
	}
	hosts, rest := p, ""
	if i := strings.IndexAny(p, "/?"); i >= 0 {
		hosts, rest = p[:i], p[i:]
	}
	path, query, hasQuery := strings.Cut(rest, "?")
	// Any other '@' makes the split uncertain: it may end a password that
	// held an unescaped '@' or '/'.
	if strings.Contains(hosts, "@") || strings.Contains(path, "@") {
		return unparseable
	}
	b.WriteString(hosts + path)
	if hasQuery {
		writeQuery(&b, query, safePostgresParams)
	}
	return b.String()
}

// redactURL handles AMQP (and any other) URLs, split by net/url as
// amqp091-go splits them. A list of hosts (CDCRELAY_AMQP_URL naming
// several broker nodes) is shown whole, each host checked as the relay
// checks it; the rest is redacted as the URL of the first node.
func redactURL(s string) string {
	parts, ok := splitAMQPURL(s)
	if !ok || len(parts.hosts) < 2 {
		return redactOneURL(s, "")
	}
	for _, h := range parts.hosts {
		if !amqpHost.MatchString(h) {
			return unparseable
		}
	}
	return redactOneURL(parts.node(parts.hosts[0]), strings.Join(parts.hosts, ","))
}

// redactOneURL redacts a single-host URL; hosts, when not empty, is shown
// in place of its host.
func redactOneURL(s, hosts string) string {
	u, err := url.Parse(s)
	// A '#' or an '@' other than the userinfo's own: the split may not be
	// the one the author meant (an unescaped '#' or '?' in a password).
	if err != nil || u.Opaque != "" || strings.Contains(s, "#") || strings.Count(s, "@") > boolInt(u.User != nil) {
		return unparseable
	}
	var b strings.Builder
	b.WriteString(u.Scheme + "://")
	if u.User != nil {
		b.WriteString(url.User(u.User.Username()).String())
		if _, ok := u.User.Password(); ok {
			b.WriteString(":" + redacted)
		}
		b.WriteString("@")
	}
	if hosts == "" {
		hosts = u.Host
	}
	b.WriteString(hosts + u.EscapedPath())
	if u.ForceQuery || u.RawQuery != "" {
		writeQuery(&b, u.RawQuery, safeAMQPParams)
	}
	return b.String()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// writeQuery writes "?" and the parameters, if any are left: allowed ones as written, other
// ones by name with the value hidden, unreadable ones not at all.
func writeQuery(b *strings.Builder, query string, safe map[string]bool) {
	var out []string
	for _, pair := range strings.Split(query, "&") {
		if pair == "" {
			continue
		}
		rawKey, _, _ := strings.Cut(pair, "=")
		key, err := url.PathUnescape(strings.TrimSpace(rawKey))
		switch {
		case err != nil:
		case safe[key] && strings.Count(pair, "=") == 1:
			out = append(out, pair)
		case paramName.MatchString(key):
			out = append(out, key+"="+redacted)
		}
	}
	if len(out) > 0 {
		b.WriteString("?" + strings.Join(out, "&"))
	}
}

// redactKeywordValue rebuilds a key=value connection string from its
// allowed pairs.
func redactKeywordValue(s string) string {
	pairs, err := keywordValues(s)
	if err != nil || len(pairs) == 0 {
		return unparseable
	}
	out := make([]string, 0, len(pairs))
	for _, kv := range pairs {
		switch {
		case safePostgresParams[kv.key]:
			out = append(out, kv.key+"="+quoteValue(kv.value))
		case paramName.MatchString(kv.key):
			out = append(out, kv.key+"="+redacted)
		}
	}
	return strings.Join(out, " ")
}

type keywordValue struct{ key, value string }

// keywordValues parses "key=value key='quoted value'" as libpq and pgx do:
// values end at white space unless single-quoted, and a backslash escapes
// the next character. It returns the pairs read before an error.
func keywordValues(s string) ([]keywordValue, error) {
	const space = " \t\n\r\v\f"
	var out []keywordValue
	s = strings.TrimLeft(s, space)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return out, errKeywordValue
		}
		key := strings.Trim(s[:eq], space)
		if key == "" || strings.ContainsAny(key, space) {
			return out, errKeywordValue
		}
		s = strings.TrimLeft(s[eq+1:], space)
		var raw string
		if strings.HasPrefix(s, "'") {
			end := 1
			for ; end < len(s) && s[end] != '\''; end++ {
				if s[end] == '\\' {
					end++
				}
			}
			if end >= len(s) {
				return out, errKeywordValue
			}
			raw, s = s[1:end], s[end+1:]
		} else {
			end := 0
			for ; end < len(s) && !strings.ContainsRune(space, rune(s[end])); end++ {
				if s[end] == '\\' {
					end++
				}
			}
			end = min(end, len(s))
			raw, s = s[:end], s[end:]
		}
		s = strings.TrimLeft(s, space)
		out = append(out, keywordValue{key, unescapeKeywordValue(raw)})
	}
	return out, nil
}

var errKeywordValue = errors.New("invalid key=value connection string")

func unescapeKeywordValue(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// quoteValue writes a value back in key=value syntax.
func quoteValue(v string) string {
	if v != "" && !strings.ContainsAny(v, " \t\n\r\v\f'\\") {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
