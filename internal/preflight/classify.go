package preflight

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/cdcrelay/cdcrelay/internal/config"
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

// createPublicationSQL is the statement cdcrelay migrate (and the relay)
// would run: a partitioned table (relkind p) is published through its root.
func (t target) createPublicationSQL(relkind string) string {
	via := ""
	if relkind == "p" {
		via = ", publish_via_partition_root = true"
	}
	return fmt.Sprintf("CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert'%s);", quoteIdent(t.publication), t.qualified(), via)
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

// pubFacts describe the publication and what it covers.
type pubFacts struct {
	exists                           bool
	allTables, viaRoot               bool
	insert, update, delete, truncate bool
	covers                           bool
	others                           []string // other tables published, schema.table
	kin                              []string // those of others of the outbox's partition or inheritance tree
	rowFilter                        string   // PostgreSQL 15+: the table's row filter
	columns                          []string // PostgreSQL 15+: published columns; nil when unknown
	canCreate                        bool     // the role owns the table and may CREATE in the database
	genColsStored                    bool     // PostgreSQL 18: publish_generated_columns = stored
}

func classifyPublication(t target, tf tableFacts, p pubFacts) []Finding {
	if !p.exists {
		return []Finding{missingPublication(t, tf, p)}
	}
	pub := quoteIdent(t.publication)
	var fs []Finding
	bad := func(sev Severity, msg, remedy string) {
		fs = append(fs, Finding{Check: checkPublication, Severity: sev, Message: msg, Remedy: remedy})
	}
	setInsert := fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert');", pub)
	if !p.insert {
		bad(Error, fmt.Sprintf("publication %s does not publish inserts: the relay would receive no events", t.publication), setInsert)
	}
	var extra []string
	for _, op := range []struct {
		on   bool
		name string
	}{{p.update, "update"}, {p.delete, "delete"}, {p.truncate, "truncate"}} {
		if op.on {
			extra = append(extra, op.name)
		}
	}
	if len(extra) > 0 {
		// The relay streams such a publication (it skips what is not an
		// insert), so this is a warning: it costs, it does not break.
		bad(Warn, fmt.Sprintf("publication %s also publishes %s: the relay works, but the walsender decodes every such change (the relay's own published_at updates and retention deletes among them) and sends it to the relay, which discards it: WAL decoding, network traffic and row data outside the insert-only scope the outbox needs",
			t.publication, strings.Join(extra, ", ")), setInsert+" (publish inserts only)")
	}
	switch {
	case p.allTables && len(p.others) == 0:
		// cdcrelay run refuses FOR ALL TABLES even while the outbox is
		// the only table: the next table created would join it.
		bad(Error, fmt.Sprintf("publication %s is FOR ALL TABLES: the relay refuses it (any table created later would be published too); it needs a publication of %s alone", t.publication, t.qualified()),
			fmt.Sprintf("give the relay a publication of its own: %s (and set CDCRELAY_PUBLICATION)", t.createPublicationSQL(tf.kind)))
	case !p.covers && p.allTables:
		bad(Error, fmt.Sprintf("publication %s is FOR ALL TABLES but does not list %s", t.publication, t.qualified()),
			"check CDCRELAY_TABLE and that the table is an ordinary, non-temporary table")
	case !p.covers && tf.kind == "":
		// No publication can cover a table that is not there: the likely
		// slip is CDCRELAY_TABLE (the table finding says it is missing).
		remedy := fmt.Sprintf("set CDCRELAY_TABLE to the outbox table; or create %s (`cdcrelay migrate`), then add it: ALTER PUBLICATION %s ADD TABLE %s;", t.qualified(), pub, t.qualified())
		if len(p.others) > 0 {
			remedy = fmt.Sprintf("set CDCRELAY_TABLE to the table publication %s publishes (%s), or create %s with `cdcrelay migrate`", t.publication, strings.Join(p.others, ", "), t.qualified())
		}
		bad(Error, fmt.Sprintf("publication %s cannot cover %s, which does not exist", t.publication, t.qualified()), remedy)
	case !p.covers:
		bad(Error, fmt.Sprintf("publication %s does not cover %s: the relay would receive no events", t.publication, t.qualified()),
			fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s;", pub, t.qualified()))
	}
	if p.covers && tf.kind == "p" && !p.viaRoot {
		bad(Error, fmt.Sprintf("%s is partitioned and publication %s publishes its rows under each partition's name, which the relay does not map", t.qualified(), t.publication),
			fmt.Sprintf("ALTER PUBLICATION %s SET (publish_via_partition_root = true);", pub))
	}
	if p.covers && p.rowFilter != "" {
		bad(Warn, fmt.Sprintf("publication %s publishes only the rows of %s matching WHERE %s: other rows are never relayed", t.publication, t.qualified(), p.rowFilter),
			fmt.Sprintf("ALTER PUBLICATION %s SET TABLE %s; (no row filter)", pub, t.qualified()))
	}
	if p.covers && p.columns != nil {
		fs = append(fs, classifyColumnList(t, tf, p)...)
	}
	if p.covers {
		fs = append(fs, classifyOthers(t, tf, p)...)
	}
	if len(fs) == 0 {
		fs = append(fs, Finding{Check: checkPublication, Message: fmt.Sprintf("%s publishes inserts only, of %s", t.publication, t.qualified())})
	}
	return fs
}

// missingPublication is the finding for a publication that does not
// exist: who could create it, if anyone.
func missingPublication(t target, tf tableFacts, p pubFacts) Finding {
	f := Finding{Check: checkPublication, Severity: Error,
		Message: fmt.Sprintf("publication %s does not exist", t.publication),
		Remedy:  fmt.Sprintf("run `cdcrelay migrate` as the owner of %s, or: %s", t.qualified(), t.createPublicationSQL(tf.kind))}
	switch {
	case tf.kind == "":
		// The table finding says why; no role could create a
		// publication of a table that is not there.
		f.Message += fmt.Sprintf(", nor does table %s it must publish", t.qualified())
		f.Remedy = "run `cdcrelay migrate` (as the schema owner) against this database: it creates both"
	case p.canCreate:
		// run creates it at start, as this role may: it works, so
		// this is a warning, not an error.
		f.Severity = Warn
		f.Message += fmt.Sprintf(" (the relay would create it at start only because role %s owns the table; create it with the schema so the relay can run as a least-privilege role)", t.role)
	default:
		f.Message += fmt.Sprintf("; role %s cannot create it (it needs to own %s and have CREATE on the database), so the relay cannot start", t.role, t.qualified())
	}
	return f
}

// classifyOthers judges the other tables a publication covering the
// outbox also publishes: FOR ALL TABLES, or one of the outbox's tree
// (whose rows may be outbox rows under another name), is refused by run;
// any other is foreign, and run skips its inserts (invariant 9).
func classifyOthers(t target, tf tableFacts, p pubFacts) []Finding {
	pub := quoteIdent(t.publication)
	own := fmt.Sprintf("give the relay a publication of its own: %s (and set CDCRELAY_PUBLICATION), or ALTER PUBLICATION %s SET TABLE %s;", t.createPublicationSQL(tf.kind), pub, t.qualified())
	if p.allTables && len(p.others) > 0 {
		return []Finding{{Check: checkPublication, Severity: Error, Remedy: own,
			Message: fmt.Sprintf("publication %s also covers every table (FOR ALL TABLES): %s: the relay refuses to stream it, since any table created later would be published too", t.publication, listSome(p.others, 5))}}
	}
	if len(p.kin) > 0 {
		return []Finding{{Check: checkPublication, Severity: Error, Remedy: own,
			Message: fmt.Sprintf("publication %s also covers %s, of the partition or inheritance tree of %s: the relay refuses to stream it, since such a row may be an outbox row under another name, and it stops there rather than skip it", t.publication, listSome(p.kin, 5), t.qualified())}}
	}
	var foreign []string
	for _, name := range p.others {
		if !slices.Contains(p.kin, name) {
			foreign = append(foreign, name)
		}
	}
	if len(foreign) == 0 {
		return nil
	}
	return []Finding{{Check: checkPublication, Severity: Warn,
		Message: fmt.Sprintf("publication %s also covers %s, which is not the outbox: the relay skips its inserts (a warning per table and session, cdcrelay_foreign_inserts_skipped_total), but the walsender decodes and sends every one of them", t.publication, listSome(foreign, 5)),
		Remedy:  fmt.Sprintf("ALTER PUBLICATION %s DROP TABLE %s; (unless another consumer needs it: then give the relay a publication of its own)", pub, strings.Join(foreign, ", "))}}
}

func listSome(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}

// slotFacts describe the replication slot.
type slotFacts struct {
	exists             bool
	slotType, plugin   string
	database           string // "" for a physical slot
	temporary, active  bool
	activePID          int
	walStatus          string // "" before PostgreSQL 13
	retained           string // WAL held back, e.g. "12 MB"; "" unknown
	publicationMissing bool   // the slot cannot be created yet
	noReplication      bool   // nor by this role
}

func classifySlot(t target, s slotFacts) Finding {
	f := Finding{Check: checkSlot}
	drop := fmt.Sprintf("SELECT pg_drop_replication_slot('%s'); (when no relay uses it)", t.slot)
	switch {
	case !s.exists:
		f.Message = fmt.Sprintf("slot %s does not exist yet: the relay creates it (permanent, pgoutput) on its first start, after the publication, and publishes rows with published_at IS NULL from its snapshot", t.slot)
	case s.slotType != "logical" || s.plugin != "pgoutput":
		kind := s.slotType
		if s.plugin != "" {
			kind += " slot with plugin " + s.plugin
		} else {
			kind += " slot"
		}
		f.Severity = Error
		f.Message = fmt.Sprintf("slot %s is a %s; the relay needs a logical pgoutput slot", t.slot, kind)
		f.Remedy = fmt.Sprintf("set CDCRELAY_SLOT to an unused name, or drop the slot: %s", drop)
	case s.database != t.database:
		f.Severity = Error
		f.Message = fmt.Sprintf("slot %s belongs to database %s, not %s", t.slot, s.database, t.database)
		f.Remedy = "set CDCRELAY_SLOT to a name of its own for this database (slot names are cluster-wide)"
	case s.walStatus == "lost" && t.slotLost == config.SlotLostRecreate:
		// run drops and recreates it (CDCRELAY_SLOT_LOST=recreate): it
		// works, with a backfill and duplicates, so a warning.
		f.Severity = Warn
		f.Message = fmt.Sprintf("slot %s is invalidated (wal_status lost): WAL it still needed was removed (max_slot_wal_keep_size); with CDCRELAY_SLOT_LOST=recreate the relay drops it, creates a new one and publishes every row with published_at IS NULL from its snapshot (consumers see duplicates)", t.slot)
		f.Remedy = "find why the relay fell so far behind (docs/runbook.md), and raise max_slot_wal_keep_size if outages that long must be ridden out"
	case s.walStatus == "lost":
		f.Severity = Error
		f.Message = fmt.Sprintf("slot %s is invalidated (wal_status lost): WAL it still needed was removed (max_slot_wal_keep_size), and CDCRELAY_SLOT_LOST=%s makes the relay stop", t.slot, t.slotLost)
		f.Remedy = fmt.Sprintf("drop it and start the relay, which recreates it and publishes rows with published_at IS NULL from the new slot's snapshot: %s; or set CDCRELAY_SLOT_LOST=recreate", drop)
	case s.temporary:
		f.Severity = Error
		f.Message = fmt.Sprintf("slot %s is temporary: it disappears with its session and the relay's position with it", t.slot)
		f.Remedy = "set CDCRELAY_SLOT to an unused name; the relay creates a permanent slot"
	default:
		f.Message = fmt.Sprintf("slot %s exists (pgoutput, database %s", t.slot, s.database)
		if s.walStatus != "" {
			f.Message += ", wal_status " + s.walStatus
		}
		if s.retained != "" {
			f.Message += ", retaining " + s.retained + " of WAL"
		}
		f.Message += ")"
		if s.walStatus == "unreserved" {
			f.Severity = Warn
			f.Message += ": it is about to pass max_slot_wal_keep_size and be invalidated"
			f.Remedy = "get the relay streaming now (see its logs), or raise max_slot_wal_keep_size"
		}
		if s.active {
			f.Message += fmt.Sprintf("; active (pid %d): another relay is streaming (hot standby will wait)", s.activePID)
		}
	}
	if !s.exists && s.publicationMissing {
		f.Message += "; it needs the publication first"
	}
	if !s.exists && s.noReplication {
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
