package preflight

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
)

const checkOtherSlots = "other_slots"

// otherSlot is another logical slot of the outbox database.
type otherSlot struct {
	name, plugin string
	// onStandby: the slot is on CDCRELAY_REPLICATION_URL's server, not
	// on the primary; it is dropped there.
	onStandby    bool
	active       bool
	app          string   // its walsender's application_name; "" when inactive
	pubs         []string // the publications it streams, when the role may read its walsender's command
	coversOutbox bool     // one of pubs publishes the outbox table
}

// otherSlotsSQL lists the other logical slots of this database with, for
// an active one, its walsender's application_name and last command. On a
// standby, a slot synced from the primary (PostgreSQL 17's copy of a
// failover slot) is left out: it is the primary's slot, listed there, and
// the copy cannot be streamed while the server is a standby. After a
// promotion such a slot may keep synced = true and be streamed, so it is
// listed on a server not in recovery. to_jsonb reads the column where it
// exists (17+, pgcaps.Caps.FailoverSlots).
const otherSlotsSQL = `
	SELECT s.slot_name::text, coalesce(s.plugin::text, ''), s.active, coalesce(a.application_name, ''), coalesce(a.query, '')
	FROM pg_replication_slots s LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
	WHERE s.slot_type = 'logical' AND s.database = current_database() AND s.slot_name <> $1
	  AND NOT (pg_is_in_recovery() AND coalesce((to_jsonb(s)->>'synced')::bool, false))
	ORDER BY 1`

// otherSlots reads every other logical slot of this database and, for an
// active one, its walsender's application_name (readable by every role)
// and its last command (readable by the same role, a superuser or
// pg_read_all_stats), whose publication_names say what it streams. With
// the slot on a standby (CDCRELAY_REPLICATION_URL) it reads that standby's
// too: another relay whose slot is there publishes every event as surely
// as one on the primary, and the primary does not see it (its walsender
// runs on the standby). Both servers are read, since another relay may
// have its slot on either, unless both URLs reach the same server (after a
// promotion, until a new standby exists).
func (s *session) otherSlots(ctx context.Context) ([]otherSlot, error) {
	out, err := readOtherSlots(ctx, s.db, s.t)
	if err != nil || s.ss == s {
		return out, err
	}
	if same, err := sameServer(ctx, s.db, s.ss.db); err != nil || same {
		return out, err
	}
	there, err := readOtherSlots(ctx, s.ss.db, s.t)
	if err != nil {
		return nil, fmt.Errorf("on the replication server: %w", err)
	}
	for i := range there {
		there[i].onStandby = true
	}
	return append(out, there...), nil
}

// sameServer reports whether a and b are sessions of one server: the same
// postmaster start, to the microsecond.
func sameServer(ctx context.Context, a, b *pgx.Conn) (bool, error) {
	var started [2]string
	for i, db := range []*pgx.Conn{a, b} {
		if err := db.QueryRow(ctx, `SELECT pg_postmaster_start_time()::text`).Scan(&started[i]); err != nil {
			return false, fmt.Errorf("read the server's start time: %w", err)
		}
	}
	return started[0] == started[1], nil
}

// readOtherSlots reads the other logical slots on db's server
// (otherSlotsSQL) and the publications the active ones stream.
func readOtherSlots(ctx context.Context, db *pgx.Conn, t target) ([]otherSlot, error) {
	rows, err := db.Query(ctx, otherSlotsSQL, t.slot)
	if err != nil {
		return nil, fmt.Errorf("read pg_replication_slots: %w", err)
	}
	var out []otherSlot
	var queries []string
	for rows.Next() {
		var o otherSlot
		var query string
		if err := rows.Scan(&o.name, &o.plugin, &o.active, &o.app, &query); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read pg_replication_slots: %w", err)
		}
		out, queries = append(out, o), append(queries, query)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read pg_replication_slots: %w", err)
	}
	for i := range out {
		out[i].pubs = publicationNames(queries[i])
		if len(out[i].pubs) == 0 {
			continue
		}
		err := db.QueryRow(ctx, `
			SELECT EXISTS (SELECT 1 FROM pg_publication p WHERE p.pubname = ANY($1) AND p.puballtables)
			    OR EXISTS (SELECT 1 FROM pg_publication_tables pt
			               JOIN pg_namespace n ON n.nspname = pt.schemaname
			               JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
			               WHERE pt.pubname = ANY($1) AND coalesce(pg_partition_root(c.oid), c.oid) = to_regclass($2))`,
			out[i].pubs, pgx.Identifier{t.schema, t.table}.Sanitize()).Scan(&out[i].coversOutbox)
		if err != nil {
			return nil, fmt.Errorf("read the publications of slot %s: %w", out[i].name, err)
		}
	}
	return out, nil
}

// publicationNamesArg finds pgoutput's publication_names option in a
// START_REPLICATION command.
var publicationNamesArg = regexp.MustCompile(`publication_names\s+'((?:[^']|'')*)'`)

// publicationNames parses the publication_names option of a walsender's
// START_REPLICATION command: a string literal holding a list of
// identifiers, each quoted or folded to lower case. nil when the command
// is not visible or has no such option.
func publicationNames(query string) []string {
	m := publicationNamesArg.FindStringSubmatch(query)
	if m == nil {
		return nil
	}
	list := strings.ReplaceAll(m[1], "''", "'")
	var names []string
	for len(list) > 0 {
		list = strings.TrimLeft(list, " ,")
		if list == "" {
			break
		}
		var name string
		if list[0] == '"' {
			end := 1
			for end < len(list) && (list[end] != '"' || (end+1 < len(list) && list[end+1] == '"')) {
				if list[end] == '"' {
					end++ // a doubled quote
				}
				end++
			}
			name = strings.ReplaceAll(list[1:min(end, len(list))], `""`, `"`)
			list = list[min(end+1, len(list)):]
		} else {
			name, list, _ = strings.Cut(list, ",")
			name = strings.ToLower(strings.TrimSpace(name))
		}
		names = append(names, name)
	}
	return names
}

// relayApplicationNames are the application_names the relay's own
// connections carry: pgconnect's default and those its URLs set. A relay's
// walsender on the primary carries CDCRELAY_DATABASE_URL's, on the standby
// CDCRELAY_REPLICATION_URL's; another relay of the same values file
// carries the same.
func relayApplicationNames(cfg config.Config) []string {
	names := []string{pgconnect.ApplicationName}
	for _, u := range []string{cfg.DatabaseURL, cfg.ReplicationURL} {
		if u == "" {
			continue
		}
		if pc, err := pgconnect.Config(u, nil); err == nil {
			if app := pc.RuntimeParams["application_name"]; app != "" && !slices.Contains(names, app) {
				names = append(names, app)
			}
		}
	}
	return names
}

// classifyOtherSlots lists every other logical slot of the database
// (standby: whether the replication server was looked at too, as the slot
// of this relay is there) and judges each that may be another relay: two
// relays with different slot names on one outbox (two releases, a copied
// values file) publish every event twice, and nothing else would say so.
//
// A pgoutput slot streamed by a connection named like a relay (relayApps)
// whose publication covers the outbox is another relay of this outbox: an
// Error, since this configuration would double every event. Its remedy
// never says to drop that slot: it is the other relay's, maybe the one in
// production, and dropping it would cost that relay its position. It says
// to reuse it (this relay replacing that one) or to fix the copied values.
// A slot that may be one (named like a relay with a publication the role
// cannot see, a publication of the outbox under another name, or nothing
// streaming it now) is a warning; only an inactive one is ever said to be
// dropped, and only once nothing will stream it again. A subscriber of
// another table, or a slot of another plugin, is listed as OK.
func classifyOtherSlots(t target, relayApps []string, standby bool, slots []otherSlot) []Finding {
	if len(slots) == 0 {
		where := ""
		if standby {
			where = ", on the primary or on the replication server"
		}
		return []Finding{{Check: checkOtherSlots, Message: fmt.Sprintf("no other logical slot in database %s%s", t.database, where)}}
	}
	var fs []Finding
	for _, o := range slots {
		state := "inactive"
		if o.active {
			state = fmt.Sprintf("active, streamed by application_name %q", o.app)
		}
		at, there := "", ""
		if o.onStandby {
			at, there = " on the replication server", " on the replication server, CDCRELAY_REPLICATION_URL"
		}
		what := fmt.Sprintf("slot %s%s (plugin %s, %s", o.name, at, o.plugin, state)
		if len(o.pubs) > 0 {
			covers := "which does not publish " + t.qualified()
			if o.coversOutbox {
				covers = "which publishes " + t.qualified()
			}
			what += fmt.Sprintf(", publication %s %s", strings.Join(o.pubs, ", "), covers)
		}
		what += ")"
		f := Finding{Check: checkOtherSlots, Message: what}
		relayNamed := o.active && slices.Contains(relayApps, o.app)
		switch {
		case o.plugin != "pgoutput":
			f.Message += ": not a relay (the relay uses pgoutput)"
		case len(o.pubs) > 0 && !o.coversOutbox:
			f.Message += ": streams other tables, not this outbox"
		case relayNamed && o.coversOutbox:
			f.Severity = Error
			f.Message += fmt.Sprintf(": another relay streams %s from its own slot; this configuration would publish every event twice, once from each slot", t.qualified())
			f.Remedy = fmt.Sprintf("if this relay is meant to replace that one, stop the other relay and reuse its slot: CDCRELAY_SLOT=%s%s (this relay then resumes from where that one stopped); otherwise these values were copied from that relay: fix CDCRELAY_SLOT, CDCRELAY_PUBLICATION and CDCRELAY_TABLE to name this relay's own outbox. Keep slot %s: the other relay streams from it",
				o.name, reuseWhere(o.onStandby, standby), o.name)
		case relayNamed || o.coversOutbox:
			f.Severity = Warn
			if relayNamed {
				f.Message += fmt.Sprintf(": another relay streams this database; its publication is not visible to role %s (it needs pg_read_all_stats to see it), so whether it relays %s is not known; if it does, every event is published twice, once from each slot", t.role, t.qualified())
			} else {
				f.Message += fmt.Sprintf(": something not named like a relay streams a publication of %s: a logical replica of the table is fine; if it is another relay of this outbox, every event is published twice, once from each slot", t.qualified())
			}
			f.Remedy = fmt.Sprintf("find its owner (docs/runbook.md#cdcrelayotherrelayondatabase); if it relays this outbox and this relay is meant to replace it, stop it and reuse its slot: CDCRELAY_SLOT=%s%s; if these values were copied from it, fix CDCRELAY_SLOT, CDCRELAY_PUBLICATION and CDCRELAY_TABLE; a relay of another table of this database, or a replica, is fine. Keep slot %s while something streams it",
				o.name, reuseWhere(o.onStandby, standby), o.name)
		case !o.active:
			f.Severity = Warn
			f.Message += fmt.Sprintf(": nothing streams it now; if it belongs to a stopped relay of %s, starting that relay publishes every event again from its slot, and meanwhile the slot keeps WAL", t.qualified())
			f.Remedy = fmt.Sprintf("find its owner first; if this relay replaces a stopped relay of this outbox, reuse its slot (CDCRELAY_SLOT=%s%s) rather than making a second one; once you know nothing will stream it again, drop it: SELECT pg_drop_replication_slot('%s');%s", o.name, reuseWhere(o.onStandby, standby), o.name, there)
		default:
			f.Message += ": streamed by another application (a subscriber?)"
		}
		fs = append(fs, f)
	}
	return fs
}

// reuseWhere says, for a remedy reusing another slot, on which server this
// relay must then stream: the slot stays where it is.
func reuseWhere(slotOnStandby, relayOnStandby bool) string {
	switch {
	case slotOnStandby:
		return ", with CDCRELAY_REPLICATION_URL on the replication server it is on"
	case relayOnStandby:
		return ", streamed from the primary: without CDCRELAY_REPLICATION_URL"
	}
	return ""
}

// otherSlotsCheck judges the database's other logical slots, on the
// primary and, with the slot on a standby, on that standby.
func otherSlotsCheck(ctx context.Context, s *session) []Finding {
	others, err := s.otherSlots(ctx)
	if err != nil {
		return []Finding{failed(checkOtherSlots, "list the other replication slots of database "+s.t.database, err)}
	}
	return classifyOtherSlots(s.t, relayApplicationNames(s.cfg), s.ss != s, others)
}
