package config

import (
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Scrub replaces in s each configured URL by its redacted form and every
// password the URLs hold, in whatever form a library may quote it: for
// text built from errors that may quote them (cdcrelay check's findings,
// the reason /readyz gives).
func (c Config) Scrub(s string) string {
	for _, sec := range c.secrets() {
		s = strings.ReplaceAll(s, sec.find, sec.replace)
	}
	return s
}

// minScrubLen is the shortest bare password scrubbed from output. Shorter
// ones would mangle ordinary words; the full URLs holding them are scrubbed
// whatever the password's length.
const minScrubLen = 4

// secret is a string that must not appear in output, and its replacement.
type secret struct{ find, replace string }

// secrets lists the configured URLs and the passwords in them, longest
// first so a URL is replaced whole before its password is, and a password
// before a shorter one it contains.
func (c Config) secrets() []secret {
	var out []secret
	raws := []string{c.DatabaseURL, c.ReplicationURL, c.AMQPURL, c.AMQPManagementURL}
	if nodes := c.AMQPNodes(); len(nodes) > 1 {
		// A library quotes the URL it dialed: one node's, not the list.
		raws = append(raws, nodes...)
	}
	for _, raw := range raws {
		if raw == "" {
			continue
		}
		out = append(out, secret{raw, Redact(raw)})
		// Every password the string holds (userinfo, password= and
		// sslpassword=, as written and decoded), in whatever form a
		// library may quote it.
		var pws []string
		for _, pw := range Secrets(raw) {
			pws = append(pws, pw, url.QueryEscape(pw), url.PathEscape(pw))
		}
		if pc, err := pgconn.ParseConfig(raw); err == nil && pc.Password != "" {
			pws = append(pws, pc.Password)
		}
		if pw, ok := rawPassword(raw); ok {
			pws = append(pws, pw) // even from a URL that does not parse
		}
		for _, pw := range pws {
			if len(pw) >= minScrubLen {
				out = append(out, secret{pw, "xxxxx"})
			}
		}
	}
	for i := 1; i < len(out); i++ { // insertion sort: a handful of entries
		for j := i; j > 0 && len(out[j].find) > len(out[j-1].find); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// rawPassword extracts the password of scheme://user:password@host… without
// parsing the URL, for URLs net/url rejects (their parse error quotes them).
func rawPassword(raw string) (string, bool) {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return "", false
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return "", false
	}
	_, pw, ok := strings.Cut(rest[:at], ":")
	return pw, ok && pw != ""
}
