package preflight

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// checkTransactions reports prepared and long-running transactions:
// creating the relay's slot waits until every transaction that holds an xid
// anywhere in the cluster has ended, so one of them keeps a first start (or
// a slot recreation) waiting, unready, for as long as it stays open.
const checkTransactions = "transactions"

// longTransaction is the age from which a transaction holding an xid is
// reported.
const longTransaction = 5 * time.Minute

// openXact is a prepared transaction (gid set) or a backend's transaction.
type openXact struct {
	gid, database, state, app string
	pid                       int32
	age                       time.Duration
}

func (x openXact) String() string {
	if x.gid != "" {
		return fmt.Sprintf("prepared transaction %q (database %s, prepared %s ago)", x.gid, x.database, x.age.Round(time.Second))
	}
	return fmt.Sprintf("pid %d (%s, application_name %q, database %s, open %s)", x.pid, x.state, x.app, x.database, x.age.Round(time.Second))
}

// transactions reads both kinds. A role without pg_read_all_stats sees
// other roles' transaction ages as NULL, so those are not reported.
func (s *session) transactions(ctx context.Context) (prepared, long []openXact, err error) {
	rows, err := s.db.Query(ctx, `
		SELECT gid, 0, database, '', '', extract(epoch FROM now() - prepared)::float8
		FROM pg_prepared_xacts
		UNION ALL
		SELECT '', pid, coalesce(datname, ''), coalesce(state, ''), coalesce(application_name, ''), extract(epoch FROM now() - xact_start)::float8
		FROM pg_stat_activity
		WHERE backend_xid IS NOT NULL AND xact_start < now() - make_interval(secs => $1) AND pid <> pg_backend_pid()
		ORDER BY 6 DESC LIMIT 20`, longTransaction.Seconds())
	if err != nil {
		return nil, nil, err
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (openXact, error) {
		var x openXact
		var age float64
		err := r.Scan(&x.gid, &x.pid, &x.database, &x.state, &x.app, &age)
		x.age = time.Duration(age * float64(time.Second))
		return x, err
	})
	if err != nil {
		return nil, nil, err
	}
	for _, x := range all {
		if x.gid != "" {
			prepared = append(prepared, x)
		} else {
			long = append(long, x)
		}
	}
	return prepared, long, nil
}

// classifyTransactions turns them into findings: a warning per kind found.
func classifyTransactions(prepared, long []openXact, slotExists bool) []Finding {
	impact := "while one is open, creating the relay's slot waits (the relay logs what it waits for and /readyz stays 503)"
	if slotExists {
		impact = "the slot exists, so the relay does not wait for them now; recreating the slot would wait for them"
	}
	var fs []Finding
	if len(prepared) > 0 {
		fs = append(fs, Finding{Check: checkTransactions, Severity: Warn,
			Message: fmt.Sprintf("%d prepared transaction(s) open: %s; %s", len(prepared), joinXacts(prepared), impact),
			Remedy:  "COMMIT PREPARED or ROLLBACK PREPARED each one (SELECT * FROM pg_prepared_xacts), once its transaction manager no longer needs it"})
	}
	if len(long) > 0 {
		fs = append(fs, Finding{Check: checkTransactions, Severity: Warn,
			Message: fmt.Sprintf("%d transaction(s) open longer than %s: %s; %s", len(long), longTransaction, joinXacts(long), impact),
			Remedy:  "end them (commit, roll back, or SELECT pg_terminate_backend(pid)); idle_in_transaction_session_timeout stops idle ones from lingering"})
	}
	if len(fs) == 0 {
		fs = append(fs, Finding{Check: checkTransactions, Message: fmt.Sprintf("no prepared transaction and none open longer than %s that this role can see", longTransaction)})
	}
	return fs
}

func joinXacts(xs []openXact) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = x.String()
	}
	return strings.Join(parts, ", ")
}

// transactionsCheck judges the open transactions a new slot would wait
// for.
func transactionsCheck(ctx context.Context, s *session) []Finding {
	prepared, long, err := s.transactions(ctx)
	if err != nil {
		return []Finding{failed(checkTransactions, "read open transactions (pg_prepared_xacts, pg_stat_activity)", err)}
	}
	return classifyTransactions(prepared, long, s.slot.Exists)
}
