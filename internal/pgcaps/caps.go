// Package pgcaps is where the relay's knowledge of PostgreSQL versions
// lives: which release first does what the relay relies on. Probe reads a
// server's version and role in one round trip; the methods of Caps derive
// each capability from them, purely, so that a table test covers every
// major (docs/architecture.md, the package table). No other package
// compares version numbers or reads server_version_num
// (internal/repocheck/versions_test.go).
//
// Catalog columns that only some majors have (pg_replication_slots.failover,
// pg_publication.pubgencols, …) are still read where the query is, through
// to_jsonb so that one statement fits every major; each such read names
// the capability here that says from which release the column exists.
package pgcaps

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The first server_version_num of each major the relay tells apart. The
// relay supports PostgreSQL 13 and later.
const (
	pg14 = 140000
	pg15 = 150000
	pg16 = 160000
	pg17 = 170000
	pg18 = 180000
)

// Caps is what the relay knows of one server: its version and whether it
// is a standby, read by Probe, and the capabilities derived from them.
type Caps struct {
	Version    int  // server_version_num, e.g. 170010
	InRecovery bool // a standby (pg_is_in_recovery())
	// Started is when the server last started (pg_postmaster_start_time()):
	// a restart after a crash may have undone what was committed
	// asynchronously before it. Zero when not probed (FromServerVersion).
	Started time.Time
}

// SessionTimeouts reports idle_session_timeout and
// client_connection_check_interval (PostgreSQL 14): a session that holds
// a lock for days turns the first off and the second on (pgconnect's
// hold); before 14 setting them is an error.
func (c Caps) SessionTimeouts() bool { return c.Version >= pg14 }

// PublicationColumnLists reports row filters and column lists on a
// publication's tables (PostgreSQL 15): pg_publication_tables.rowfilter
// and attnames exist from 15 (slot.ReadPublication reads them through
// to_jsonb).
func (c Caps) PublicationColumnLists() bool { return c.Version >= pg15 }

// OriginNone reports pgoutput's origin option (PostgreSQL 16): a stream
// that asks for origin 'none' has the walsender skip every transaction
// carrying a replication origin before its reorder buffer. Only from 16
// do the marks' and retention's origins save the walsender any work.
func (c Caps) OriginNone() bool { return c.Version >= pg16 }

// DecodesOnStandby reports logical decoding on a physical standby
// (PostgreSQL 16): the slot may be on CDCRELAY_REPLICATION_URL's standby.
// pg_replication_slots.conflicting and pg_log_standby_snapshot() come
// with it.
func (c Caps) DecodesOnStandby() bool { return c.Version >= pg16 }

// FailoverSlots reports failover slots (PostgreSQL 17): the FAILOVER
// option of CREATE_ and ALTER_REPLICATION_SLOT, the failover, synced and
// invalidation_reason columns of pg_replication_slots, and
// synchronized_standby_slots.
func (c Caps) FailoverSlots() bool { return c.Version >= pg17 }

// CanFailover reports whether the server can keep a failover slot:
// FailoverSlots, and a primary (PostgreSQL refuses failover for a slot
// created on a standby).
func (c Caps) CanFailover() bool { return c.FailoverSlots() && !c.InRecovery }

// PublishesGenerated reports generated columns in a publication's stream
// (PostgreSQL 18, publish_generated_columns, pg_publication.pubgencols):
// before 18 pgoutput never sends a generated column, so the relay refuses
// to map one.
func (c Caps) PublishesGenerated() bool { return c.Version >= pg18 }

// String reads like "PostgreSQL 17.10 (primary)".
func (c Caps) String() string {
	role := "primary"
	if c.InRecovery {
		role = "standby"
	}
	return fmt.Sprintf("PostgreSQL %s (%s)", versionString(c.Version), role)
}

// versionString turns server_version_num into "17.10" (or "9.6.24" before
// PostgreSQL 10, whose numbers have three parts).
func versionString(num int) string {
	if num >= 100000 {
		return fmt.Sprintf("%d.%d", num/10000, num%10000)
	}
	return fmt.Sprintf("%d.%d.%d", num/10000, num/100%100, num%100)
}

// FromServerVersion derives the capabilities from the server_version
// parameter the server reports at connection start ("15.4", "17.2 (Debian
// 17.2-1)"), without a round trip; the role is unknown there (a primary
// is assumed). Only the major counts for a capability: an unreadable one
// gives version 0, which has none.
func FromServerVersion(v string) Caps {
	major, _, _ := strings.Cut(v, ".")
	n, _ := strconv.Atoi(strings.TrimFunc(major, func(r rune) bool { return r < '0' || r > '9' }))
	return Caps{Version: n * 10000}
}
