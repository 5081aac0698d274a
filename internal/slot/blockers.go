package slot

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Blocker is a transaction that CREATE_REPLICATION_SLOT waits for: the
// slot becomes consistent only when every transaction that had an xid when
// its creation began has ended, in any database of the cluster.
type Blocker struct {
	PreparedGID     string // set for a prepared transaction (pg_prepared_xacts)
	PID             int32  // set for a backend
	State           string // the backend's state ("idle in transaction", …); empty when hidden
	ApplicationName string
	Database        string
	Xid             string
	Age             time.Duration // since xact_start or PREPARE; -1 when hidden from this role
	WaitedOn        bool          // the slot's walsender waits for this one right now
}

func (b Blocker) String() string {
	age := "age unknown (grant pg_read_all_stats to see it)"
	if b.Age >= 0 {
		age = "open " + b.Age.Round(time.Second).String()
	}
	now := ""
	if b.WaitedOn {
		now = ", waited on now"
	}
	if b.PreparedGID != "" {
		return fmt.Sprintf("prepared transaction gid=%q xid=%s database=%s %s%s", b.PreparedGID, b.Xid, b.Database, age, now)
	}
	state := b.State
	if state == "" {
		state = "state hidden"
	}
	return fmt.Sprintf("backend pid=%d (%s) xid=%s application_name=%q database=%s %s%s", b.PID, state, b.Xid, b.ApplicationName, b.Database, age, now)
}

// Describe joins blockers for a log line or a status.
func Describe(bs []Blocker) string {
	parts := make([]string, len(bs))
	for i, b := range bs {
		parts[i] = b.String()
	}
	return strings.Join(parts, "; ")
}

// maxBlockers bounds how many blockers one report names.
const maxBlockers = 10

// CreateBlockers lists what the creation of a slot on walsender pid waits
// for: every prepared transaction, and every backend but exclude holding
// an xid whose transaction began more than waited ago, by the server's
// clock (or whose start this role cannot see), the one the walsender waits on first. It reads pg_locks,
// which every role may read, so the list is complete even for a
// least-privilege role; only ages and states may be hidden.
func CreateBlockers(ctx context.Context, db *pgx.Conn, walsender int32, waited time.Duration, exclude []int32) ([]Blocker, error) {
	rows, err := db.Query(ctx, `
		WITH waiting AS (
			SELECT transactionid FROM pg_locks
			WHERE pid = $1 AND locktype = 'transactionid' AND NOT granted)
		SELECT gid, 0, '', '', database, transaction::text,
		       extract(epoch FROM now() - prepared)::float8,
		       transaction IN (SELECT transactionid FROM waiting)
		FROM pg_prepared_xacts
		UNION ALL
		SELECT '', l.pid, coalesce(a.state, ''), coalesce(a.application_name, ''), coalesce(a.datname, ''), l.transactionid::text,
		       coalesce(extract(epoch FROM now() - a.xact_start)::float8, -1),
		       l.transactionid IN (SELECT transactionid FROM waiting)
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
		  AND l.pid IS NOT NULL AND l.pid <> ALL($2::int4[])
		  AND (a.xact_start IS NULL OR a.xact_start <= now() - make_interval(secs => $3))
		ORDER BY 8 DESC, 7 DESC
		LIMIT $4`, walsender, exclude, waited.Seconds(), maxBlockers)
	if err != nil {
		return nil, fmt.Errorf("look up the transactions slot creation waits for: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Blocker, error) {
		var b Blocker
		var age float64
		err := row.Scan(&b.PreparedGID, &b.PID, &b.State, &b.ApplicationName, &b.Database, &b.Xid, &age, &b.WaitedOn)
		b.Age = time.Duration(age * float64(time.Second))
		if age < 0 {
			b.Age = -1
		}
		return b, err
	})
}
