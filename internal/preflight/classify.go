package preflight

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// This file turns facts read from the server into findings. It does no I/O,
// so every rule is unit tested without a database.

// Check names, in the order Run reports them.
const (
	checkDatabase    = "database"
	checkWALLevel    = "wal_level"
	checkSlots       = "max_replication_slots"
	checkSenders     = "max_wal_senders"
	checkKeepSize    = "max_slot_wal_keep_size"
	checkSyncStandby = "synchronous_standby_names"
	checkEncoding    = "server_encoding"
	checkPrivileges  = "privileges"
	checkReplConn    = "replication connection"
	checkTable       = "table"
	checkMapping     = "mapping"
	checkPublication = "publication"
	checkSlot        = "slot"
	checkStandby     = "replication server"
	checkFailover    = "failover"
	checkOrigin      = "mark origin"
	checkBroker      = "broker"
	checkExchange    = "exchange"
)

// target is what the configuration names, resolved.
type target struct {
	schema, table          string
	publication, slot      string
	database, role         string // current_database(), current_user
	id, key, payload       string // required columns
	headers, exch, msgType string // optional columns ("" = not configured)
	slotLost               string // CDCRELAY_SLOT_LOST
	poison                 string // CDCRELAY_POISON
}

// qualified is the table's name as SQL, parts quoted where needed.
func (t target) qualified() string { return quoteIdent(t.schema) + "." + quoteIdent(t.table) }

// scope is what the rule book (internal/slot) judges the facts against;
// check's remedies quote identifiers only where SQL needs it.
func (t target) scope() slot.Scope {
	return slot.Scope{
		Outbox: config.Outbox{Publication: t.publication, Slot: t.slot, Schema: t.schema, Table: t.table},
		Quote:  quoteIdent, RecreateLost: t.slotLost == config.SlotLostRecreate,
	}
}

// mapped are the configured columns, as the rule book takes them.
func (t target) mapped() slot.Mapped {
	return slot.Mapped{Required: []string{t.id, t.key, t.payload}, Optional: []string{t.headers, t.exch, t.msgType}}
}

// findings turns the rule book's problems into check's findings: a fatal
// problem (the relay refuses to stream) is an Error, any other a Warn.
func findings(check string, ps []slot.Problem) []Finding {
	fs := make([]Finding, 0, len(ps))
	for _, p := range ps {
		sev := Warn
		if p.Fatal {
			sev = Error
		}
		fs = append(fs, Finding{Check: check, Severity: sev, Message: p.Message, Remedy: p.Remedy})
	}
	return fs
}

// publishedAtColumn is the column the janitor sets once the broker acked a
// row; its name is part of the schema, not configurable.
const publishedAtColumn = "published_at"

// ClassifyWALLevel judges wal_level, for check and for the relay before it
// creates a slot.
func ClassifyWALLevel(level string, pendingRestart bool) Finding {
	f := Finding{Check: checkWALLevel}
	if level == "logical" {
		f.Message = "logical"
		return f
	}
	f.Severity = Error
	f.Message = fmt.Sprintf("wal_level is %s; logical decoding (the relay's slot) needs logical", level)
	f.Remedy = "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL (managed services: enable logical replication in the parameter group)"
	if pendingRestart {
		f.Message += " (a changed value is waiting for a restart)"
		f.Remedy = "restart PostgreSQL: the new wal_level applies only after a restart"
	}
	return f
}

// classifyEncoding checks the database encoding. The relay reads every
// text as UTF-8 (client_encoding=UTF8 on each connection): PostgreSQL
// converts any real encoding, but SQL_ASCII stores bytes unchecked, so a
// row whose text is not UTF-8 fails the conversion on both the stream and
// the backfill, and MULE_INTERNAL has no conversion to UTF-8 at all.
func classifyEncoding(encoding string) Finding {
	f := Finding{Check: checkEncoding, Message: encoding}
	switch encoding {
	case "SQL_ASCII":
		f.Severity = Warn
		f.Message = "database encoding SQL_ASCII: the relay reads text as UTF-8; a row whose text is not valid UTF-8 stops both the backfill and the stream with 'invalid byte sequence for encoding \"UTF8\"' until the row is corrected or deleted and the slot dropped"
		f.Remedy = "use a database with a real encoding (UTF8, or any encoding PostgreSQL converts), or make sure every text the outbox holds is valid UTF-8"
	case "MULE_INTERNAL":
		f.Severity = Error
		f.Message = "database encoding MULE_INTERNAL has no conversion to UTF-8, which every connection of the relay asks for"
		f.Remedy = "move the outbox to a database with a real encoding (UTF8, or any encoding PostgreSQL converts to UTF-8)"
	}
	return f
}

// classifyHeadroom checks a pool (replication slots, WAL senders) that the
// relay needs `need` more of.
func classifyHeadroom(check string, limit, used, need int, purpose string) Finding {
	f := Finding{Check: check}
	free := limit - used
	switch {
	case need == 0:
		f.Message = fmt.Sprintf("%d of %d in use, the relay's among them", used, limit)
	case free >= need:
		f.Message = fmt.Sprintf("%d of %d in use; %d free for the relay's %s", used, limit, free, purpose)
	default:
		f.Severity = Error
		f.Message = fmt.Sprintf("%d of %d in use: none free for the relay's %s", used, limit, purpose)
		f.Remedy = fmt.Sprintf("raise %s (takes a restart), or free one (SELECT * FROM pg_replication_slots / pg_stat_replication shows who holds them)", check)
	}
	return f
}

// classifyKeepSize: keepMB is the setting in MB (-1: unlimited); supported
// is false before PostgreSQL 13.
func classifyKeepSize(keepMB int64, supported bool) Finding {
	f := Finding{Check: checkKeepSize}
	switch {
	case !supported:
		f.Severity = Warn
		f.Message = "this server has no max_slot_wal_keep_size (PostgreSQL before 13): a stalled relay makes PostgreSQL retain WAL without bound"
		f.Remedy = "alert on the slot's retained WAL (pg_replication_slots.restart_lsn), or upgrade to PostgreSQL 13 or later"
	case keepMB < 0:
		f.Severity = Warn
		f.Message = "unset (-1): if the relay stops for long, its slot makes PostgreSQL retain WAL until the disk fills"
		f.Remedy = "ALTER SYSTEM SET max_slot_wal_keep_size = '<WAL written in the longest relay outage you must ride out, e.g. 16GB>'; SELECT pg_reload_conf(); (a slot beyond it is lost: the relay then needs a new slot and backfills unpublished rows)"
	default:
		f.Message = fmt.Sprintf("%dMB: a slot further behind is invalidated instead of filling the disk", keepMB)
	}
	return f
}

func classifySyncStandby(setting string) Finding {
	f := Finding{Check: checkSyncStandby}
	if strings.TrimSpace(setting) == "" {
		f.Message = "empty: commits do not wait for any standby"
		return f
	}
	match, err := syncStandbyMatches(setting, ReplicationApplicationName)
	switch {
	case err != nil:
		f.Severity = Warn
		f.Message = fmt.Sprintf("cannot tell whether %q names the relay: %v", setting, err)
		f.Remedy = fmt.Sprintf("make sure no entry is %s or *", ReplicationApplicationName)
	case match != "":
		f.Severity = Error
		f.Message = fmt.Sprintf("%q matches the relay's application_name %s (by %s): commits would wait for the relay, whose confirmations follow broker acks, so a slow or blocked broker would stall every writing transaction",
			setting, ReplicationApplicationName, match)
		f.Remedy = "list the physical standbys by name in synchronous_standby_names, without * or " + ReplicationApplicationName + "; then SELECT pg_reload_conf();"
	default:
		f.Message = fmt.Sprintf("%q does not name the relay", setting)
	}
	return f
}

// roleFacts are the role's attributes and grants.
type roleFacts struct {
	super, replication, rdsReplication bool
	schemaUsage                        bool
	tableExists                        bool
	selectPriv, deletePriv             bool
	hasPublishedAt, updatePublishedAt  bool
	// cannotPark lists the poison-bookkeeping columns (attempts,
	// last_error) the table has but the role may not update.
	cannotPark []string
}

func classifyPrivileges(t target, r roleFacts) []Finding {
	role := quoteIdent(t.role)
	if r.super {
		return []Finding{{Check: checkPrivileges, Message: fmt.Sprintf("role %s is a superuser (it works; a least-privilege role is safer, see docs/least-privilege.md)", t.role)}}
	}
	var fs []Finding
	var have []string
	missing := func(priv, why, remedy string) {
		fs = append(fs, lacks(t.role, priv, why, remedy))
	}
	switch {
	case r.replication:
		have = append(have, "REPLICATION")
	case r.rdsReplication:
		have = append(have, "REPLICATION (rds_replication)")
	default:
		fs = append(fs, NoReplication(t.role))
	}
	if r.tableExists {
		if !r.schemaUsage {
			missing("USAGE on schema "+t.schema, "it cannot reach "+t.qualified(),
				fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s;", t.schema, role))
		}
		on := " on " + t.qualified()
		if r.selectPriv {
			have = append(have, "SELECT")
		} else {
			fs = append(fs, NoSelect(t.schema, t.table, t.role))
		}
		switch {
		case !r.hasPublishedAt: // reported by the mapping check
		case r.updatePublishedAt:
			have = append(have, "UPDATE (published_at)")
		default:
			// One grant for every column it updates: the park columns the
			// role lacks too, so their warning below need not repeat it.
			cols := append([]string{publishedAtColumn}, r.cannotPark...)
			why := "it marks acknowledged rows published"
			if len(r.cannotPark) > 0 {
				why += " (and records " + strings.Join(r.cannotPark, ", ") + " on parked poison rows)"
			}
			missing("UPDATE ("+strings.Join(cols, ", ")+")"+on, why,
				fmt.Sprintf("GRANT UPDATE (%s) ON %s TO %s;", strings.Join(cols, ", "), t.qualified(), role))
			r.cannotPark = nil
		}
		if r.deletePriv {
			have = append(have, "DELETE")
		} else {
			missing("DELETE"+on, "it deletes old published rows",
				fmt.Sprintf("GRANT DELETE ON %s TO %s;", t.qualified(), role))
		}
	}
	if len(r.cannotPark) > 0 {
		fs = append(fs, Finding{Check: checkPrivileges, Severity: Warn,
			Message: fmt.Sprintf("role %s cannot UPDATE %s on %s: a parked poison row (CDCRELAY_POISON=park) is still skipped and logged, but its attempts and last_error are not recorded",
				t.role, strings.Join(r.cannotPark, ", "), t.qualified()),
			Remedy: fmt.Sprintf("GRANT UPDATE (published_at, %s) ON %s TO %s;", strings.Join(r.cannotPark, ", "), t.qualified(), role)})
	}
	if len(fs) == 0 || (len(fs) == 1 && fs[0].Severity == Warn) {
		where := ""
		if r.tableExists {
			where = " on " + t.qualified()
		}
		fs = append(fs, Finding{Check: checkPrivileges, Message: fmt.Sprintf("role %s has %s%s", t.role, strings.Join(have, ", "), where)})
	}
	return fs
}

// classifyPublication reports the publication's problems
// (slot.PublicationProblems, which the relay refuses to stream on too),
// or that it is as the relay needs.
func classifyPublication(t target, tf tableFacts, p slot.PublicationFacts) []Finding {
	fs := findings(checkPublication, slot.PublicationProblems(t.scope(), tf.facts(t), p, tf.mappedColumns(), t.mapped()))
	if len(fs) == 0 {
		fs = append(fs, Finding{Check: checkPublication, Message: fmt.Sprintf("%s publishes inserts only, of %s", t.publication, t.qualified())})
	}
	return fs
}

// slotFacts are the slot's (slot.ReadSlot), and why check cannot create
// it yet.
type slotFacts struct {
	slot.Info
	publicationMissing bool // the slot cannot be created yet
	noReplication      bool // nor by this role
}

// classifySlot reports the slot's first problem (slot.SlotProblems, which
// the relay refuses to stream on too), or what it is.
func classifySlot(t target, s slotFacts) Finding {
	f := Finding{Check: checkSlot}
	ps := slot.SlotProblems(t.scope(), s.Info)
	switch {
	case len(ps) > 0:
		f = findings(checkSlot, ps)[0]
	case !s.Exists:
		f.Message = fmt.Sprintf("slot %s does not exist yet: the relay creates it (permanent, pgoutput) on its first start, after the publication, and publishes rows with published_at IS NULL from its snapshot", t.slot)
	default:
		f.Message = s.Summary(t.slot)
	}
	if s.Active && !s.Lost && f.Severity != Error {
		f.Message += fmt.Sprintf("; active (pid %d): another relay is streaming (hot standby will wait)", s.ActivePID)
	}
	if !s.Exists && s.publicationMissing {
		f.Message += "; it needs the publication first"
	}
	if !s.Exists && s.noReplication {
		f.Message += "; it needs a role with REPLICATION"
	}
	return f
}

var simpleIdent = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

// reserved are keywords that must be quoted even when lower-case; a role
// or column of such a name is rare but legal.
var reserved = map[string]bool{
	"all": true, "and": true, "any": true, "as": true, "check": true, "column": true, "create": true,
	"current_user": true, "default": true, "from": true, "grant": true, "group": true, "order": true,
	"select": true, "session_user": true, "table": true, "to": true, "user": true, "where": true,
}

// quoteIdent quotes an identifier for a remedy only when it needs it.
func quoteIdent(s string) string {
	if simpleIdent.MatchString(s) && !reserved[s] {
		return s
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}
