// Package preflight checks, before the relay runs, that a database and a
// broker are set up the way the relay needs them: wal_level, slot and sender
// headroom, the role's privileges, the outbox table against the column
// mapping, the publication, the slot, WAL retention, synchronous standbys and
// the exchange. Each problem is a Finding with a remedy.
//
// The checks only read: the database session is read-only and the broker
// check declares nothing (a passive declare). Findings never contain a
// password: URLs are shown redacted and every finding is scrubbed of the
// configured secrets before Run returns it.
package preflight

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/config"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
)

// Severity grades a finding.
type Severity int

// The severities. Any Error makes `cdcrelay check` exit non-zero.
const (
	OK Severity = iota
	Warn
	Error
)

func (s Severity) String() string {
	switch s {
	case OK:
		return "OK"
	case Warn:
		return "WARN"
	case Error:
		return "ERROR"
	}
	return fmt.Sprintf("Severity(%d)", int(s))
}

// Finding is the result of one check: what was found and, unless it is OK,
// what to do about it.
type Finding struct {
	Check    string // short, stable name: "wal_level", "publication", …
	Severity Severity
	Message  string
	Remedy   string
}

// ReplicationApplicationName is the application_name of the relay's
// replication connection (internal/pgconnect sets it). A synchronous_standby_names
// entry matching it would make every commit wait for the broker.
const ReplicationApplicationName = pgconnect.ApplicationName

// checkApplicationName is the application_name of the preflight's own
// connections; it must not match ReplicationApplicationName.
const checkApplicationName = "cdcrelay check"

// DefaultTimeout bounds each connection attempt and statement when
// Options.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// Options tune Run.
type Options struct {
	// Timeout bounds each connection attempt (database, replication,
	// broker), each statement, and the whole broker check. Zero means
	// DefaultTimeout.
	Timeout time.Duration
}

// Run checks the database and broker cfg points at and returns every
// finding, in a fixed order. A check that cannot run (no connection, a
// failing query) is itself an Error finding; Run never panics on a bad
// environment and never returns a finding containing a configured secret.
func Run(ctx context.Context, cfg config.Config, opts Options) []Finding {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	var fs []Finding
	fs = append(fs, databaseChecks(ctx, cfg, opts)...)
	fs = append(fs, brokerChecks(ctx, cfg, opts)...)
	return scrub(fs, secrets(cfg))
}

// Write prints one aligned line per finding (severity, check, message and,
// unless OK, "  remedy: …"), then a summary line, and returns the number of
// Error findings.
func Write(w io.Writer, fs []Finding) (errors int) {
	width := 0
	for _, f := range fs {
		width = max(width, len(f.Check))
	}
	var warnings, oks int
	for _, f := range fs {
		switch f.Severity {
		case Error:
			errors++
		case Warn:
			warnings++
		default:
			oks++
		}
		line := fmt.Sprintf("%-5s  %-*s  %s", f.Severity, width, f.Check, oneLine(f.Message))
		if f.Severity != OK && f.Remedy != "" {
			line += "  remedy: " + oneLine(f.Remedy)
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintf(w, "%s, %s, %d ok\n", plural(errors, "error"), plural(warnings, "warning"), oks)
	return errors
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// oneLine keeps a finding on its line whatever an error message holds.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\r", " ")), " ")
}

// minScrubLen is the shortest bare password scrubbed from findings. Shorter
// ones would mangle ordinary words; the full URLs holding them are scrubbed
// whatever the password's length.
const minScrubLen = 4

// secret is a string that must not appear in output, and its replacement.
type secret struct{ find, replace string }

// secrets lists the configured URLs and the passwords in them, longest
// first so a URL is replaced whole before its password is.
func secrets(cfg config.Config) []secret {
	var out []secret
	for _, raw := range []string{cfg.DatabaseURL, cfg.AMQPURL} {
		if raw == "" {
			continue
		}
		out = append(out, secret{raw, config.Redact(raw)})
		// Every password the string holds (userinfo, password= and
		// sslpassword=, as written and decoded), in whatever form a
		// library may quote it.
		var pws []string
		for _, pw := range config.Secrets(raw) {
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

// scrub replaces every secret in every finding.
func scrub(fs []Finding, ss []secret) []Finding {
	clean := func(s string) string {
		for _, sec := range ss {
			s = strings.ReplaceAll(s, sec.find, sec.replace)
		}
		return s
	}
	for i := range fs {
		fs[i].Check, fs[i].Message, fs[i].Remedy = clean(fs[i].Check), clean(fs[i].Message), clean(fs[i].Remedy)
	}
	return fs
}
