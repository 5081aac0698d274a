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
	"strings"
	"time"

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
	fs = append(fs, database(ctx, cfg, opts)...)
	fs = append(fs, brokerChecks(ctx, cfg, opts)...)
	fs = append(fs, topologyChecks(ctx, cfg, managementURL(cfg), opts)...)
	return scrub(fs, cfg.Scrub)
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

// scrub applies clean (config.Config.Scrub) to every field of every finding.
func scrub(fs []Finding, clean func(string) string) []Finding {
	for i := range fs {
		fs[i].Check, fs[i].Message, fs[i].Remedy = clean(fs[i].Check), clean(fs[i].Message), clean(fs[i].Remedy)
	}
	return fs
}
