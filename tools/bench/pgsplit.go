package main

// The split of PostgreSQL's CPU by process: each backend of the throwaway
// cluster is classified from pg_stat_activity (backend_type,
// application_name, role, last statement) and its CPU read from
// /proc/<pid>/stat at both ends of a window.

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
)

// pgClass is who a PostgreSQL process works for.
type pgClass string

const (
	classInserter  pgClass = "inserter"  // the bench's inserting backend: the service's own writes
	classWalsender pgClass = "walsender" // the relay's replication connection: decoding
	classJanitor   pgClass = "janitor"   // the relay's marking UPDATEs
	classMonitor   pgClass = "monitor"   // the relay's backlog and slot gauges
	classRelay     pgClass = "relay, other"
	classDrainer   pgClass = "polling drainer"
	classOther     pgClass = "other" // postmaster, auxiliary processes, autovacuum, the bench's own statements, exited backends
	// A physical standby's share, which the user pays for the standby
	// itself, relay or not: its walsender on the primary, and on the
	// standby the startup process (replay) and the walreceiver.
	classPhysical pgClass = "standby's walsender"
	classReplay   pgClass = "replay"
)

// pgClasses is the report's column order.
var pgClasses = []pgClass{classInserter, classWalsender, classJanitor, classMonitor, classRelay, classDrainer, classOther}

// onRelaysBehalf says whether a class's CPU is spent for the relay: every
// connection the relay opens, not the service's inserts.
func onRelaysBehalf(c pgClass) bool {
	return c == classWalsender || c == classJanitor || c == classMonitor || c == classRelay
}

// pgBackend is one row of pg_stat_activity.
type pgBackend struct {
	pid                    int
	backendType, app, user string
	database               string // "" for a physical walsender and the auxiliary processes
	query                  string // the last statement (or the running one)
}

// Statement fragments that tell the relay's connections apart: they all
// carry application_name cdcrelay (internal/pgconnect), so the janitor
// and the monitor are known by what they run (internal/janitor/write.go,
// internal/monitor/query.go, floor.go and monitor.go).
var (
	// After each flush the janitor reads its marks' WAL position and the
	// standbys it must wait for, and asks which unseen rows' transactions
	// still run (standbys.go, write.go): often its last statement. On a
	// standby that holds the slot it asks whether it replayed its marks,
	// and once promoted whether the rows are marked (replica.go); the
	// monitor reads the slot's health (slotOnlySQL).
	janitorSQL = []string{"SET published_at = now()", "SET attempts = attempts + 1", "format_type(a.atttypid",
		"'synchronized_standby_slots'", "s.restart_lsn < $1::pg_lsn", "pg_visible_in_snapshot",
		"coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn", "[]) AND published_at IS NULL"}
	// Each refresh ends by listing the other relays' slots (otherRelaysSQL,
	// most often the connection's last statement); on the HOT layout the
	// monitor also reads the open transactions before each bounded
	// backlog scan (floor.go's readingSQL).
	monitorSQL = []string{"AS unpublished", "bool_or(attname = 'enqueued_at')", "idle_session_timeout", "THEN pg_last_wal_replay_lsn() ELSE",
		"current_setting('application_name')", "l.locktype = 'virtualxid'"}
	// retention's (internal/retention): the table's inspection, its size,
	// the DELETE batches; told apart in pg_stat_statements, not here.
	retentionSQL = []string{"DELETE FROM", "pg_partition_tree", "indpred"}
)

// classify says who a backend works for, on a primary or a standby alike;
// inserter is the inserting connection's pid. A relay connection whose
// statement names neither the janitor nor the monitor (the slot lock, the
// session's set-up, retention) is classRelay. A walsender is the relay's
// when it decodes (it has a database) or carries the relay's name; else
// it streams WAL to a physical standby.
func classify(be pgBackend, inserter int) pgClass {
	switch {
	case be.backendType == "walsender" && (be.database != "" || strings.HasPrefix(be.app, pgconnect.ApplicationName)):
		return classWalsender
	case be.backendType == "walsender":
		return classPhysical
	case be.backendType == "startup" || be.backendType == "walreceiver":
		return classReplay
	case be.pid == inserter && inserter != 0:
		return classInserter
	case be.user == drainerRole:
		return classDrainer
	case !strings.HasPrefix(be.app, pgconnect.ApplicationName):
		return classOther
	case containsAny(be.query, janitorSQL):
		return classJanitor
	case containsAny(be.query, monitorSQL):
		return classMonitor
	}
	return classRelay
}

func containsAny(s string, parts []string) bool {
	for _, p := range parts {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

// pgProc is a backend seen in a sample: its class and its CPU so far.
type pgProc struct {
	class pgClass
	cpu   time.Duration
}

// activitySQL lists the cluster's processes (superuser: every statement
// is visible).
const activitySQL = `SELECT pid, coalesce(backend_type, ''), coalesce(application_name, ''),
	coalesce(usename::text, ''), coalesce(datname::text, ''), coalesce(query, '') FROM pg_stat_activity`

// sampleBackends reads the class and CPU of every backend of the server
// db is connected to.
func (b *bench) sampleBackends(ctx context.Context, db *pgx.Conn) (map[int]pgProc, error) {
	rows, err := db.Query(ctx, activitySQL)
	if err != nil {
		return nil, fmt.Errorf("pg_stat_activity: %w", err)
	}
	defer rows.Close()
	inserter := 0
	if b.ins != nil {
		inserter = int(b.ins.db.PgConn().PID())
	}
	out := map[int]pgProc{}
	for rows.Next() {
		var be pgBackend
		var pid int32
		if err := rows.Scan(&pid, &be.backendType, &be.app, &be.user, &be.database, &be.query); err != nil {
			return nil, fmt.Errorf("pg_stat_activity: %w", err)
		}
		be.pid = int(pid)
		cpu, err := backendCPU(be.pid)
		if err != nil {
			continue // ended meanwhile: its time is in the postmaster's reaped time
		}
		out[be.pid] = pgProc{class: classify(be, inserter), cpu: cpu}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pg_stat_activity: %w", err)
	}
	return out, nil
}

// pgSplit is PostgreSQL's CPU in a window by class, with the number of
// backends of each class alive at its end.
type pgSplit struct {
	cpu      map[pgClass]time.Duration
	backends map[pgClass]int
}

// splitCPU is what each class spent between two samples out of total, the
// whole cluster's: each backend alive at the end counts its CPU since the
// start (all of it if it started meanwhile); classOther is the rest of
// total, so backends that exited inside the window, the postmaster and
// the auxiliary processes are in it. A relay connection that had not yet
// run its telling statement at the end keeps the class it had at the
// start.
func splitCPU(start, end map[int]pgProc, total time.Duration) pgSplit {
	out := pgSplit{cpu: map[pgClass]time.Duration{}, backends: map[pgClass]int{}}
	var known time.Duration
	for pid, e := range end {
		d := e.cpu
		class := e.class
		if s, ok := start[pid]; ok {
			if s.cpu <= e.cpu {
				d = e.cpu - s.cpu
			}
			if class == classRelay && s.class != classOther {
				class = s.class
			}
		}
		out.backends[class]++
		if class == classOther {
			continue
		}
		out.cpu[class] += d
		known += d
	}
	out.cpu[classOther] = max(total-known, 0)
	return out
}

// relaysBehalf is the CPU of the classes spent for the relay.
func (p pgSplit) relaysBehalf() time.Duration {
	var d time.Duration
	for c, v := range p.cpu {
		if onRelaysBehalf(c) {
			d += v
		}
	}
	return d
}

// backendCPU is a backend's CPU time so far, to the nanosecond from
// /proc/<pid>/schedstat (a backend is one thread), else in clock ticks
// from /proc/<pid>/stat: a backend's share of a short window is often
// only a few ticks.
func backendCPU(pid int) (time.Duration, error) {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid)); err == nil {
		if d, err := parseSchedstat(string(b)); err == nil {
			return d, nil
		}
	}
	return processCPU(pid)
}

// parseSchedstat reads the first field of /proc/<pid>/schedstat: the
// time the task has run on a CPU, in nanoseconds.
func parseSchedstat(s string) (time.Duration, error) {
	f := strings.Fields(s)
	if len(f) < 1 {
		return 0, fmt.Errorf("schedstat: empty")
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || ns < 0 {
		return 0, fmt.Errorf("schedstat: %q", f[0])
	}
	return time.Duration(ns), nil
}
