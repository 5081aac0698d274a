package preflight

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
)

// This file reads the routing keys the outbox's rows carry, for check to
// judge them against the broker's bindings (topology_unroutable.go).

// recentRows is how many of the newest rows (by the id column) check reads
// the routing keys of, besides up to as many unpublished rows: a bounded
// read (a backward scan of the id's index, the unpublished rows' partial
// index) whatever the table's size, that sees the keys services write now
// and the ones the relay will publish next.
const recentRows = 1000

// maxRecentKeys bounds how many distinct routing keys (with their
// exchange) check judges, the most frequent first.
const maxRecentKeys = 100

// recentKey is one routing key of the recent rows, with the exchange the
// rows name ("" when they name none: CDCRELAY_EXCHANGE).
type recentKey struct {
	exchange, key     string
	rows, unpublished int
}

// recentKeys is what readRecentKeys found.
type recentKeys struct {
	keys     []recentKey // the most frequent first, at most maxRecentKeys
	rows     int         // the rows read
	distinct int         // distinct (exchange, key) pairs among them
}

// readRecentKeys reads the routing keys of the newest rows and of the
// unpublished ones, with their exchange column when the table has the
// configured one, over a read-only session of its own (the database
// checks' session is closed by the time the broker's bindings are read).
// A row whose routing key is NULL is poison, not a routing problem, and is
// left out.
func readRecentKeys(ctx context.Context, cfg config.Config, opts Options) (recentKeys, error) {
	schema, table, err := config.SplitTable(cfg.Table)
	if err != nil {
		return recentKeys{}, fmt.Errorf("CDCRELAY_TABLE: %w", err)
	}
	db, err := pgconnect.Connect(ctx, cfg.DatabaseURL, "to database", checkSession(opts, statementTimeout(opts)))
	if err != nil {
		return recentKeys{}, fmt.Errorf("%w: %w", errNoOutboxSession, err)
	}
	defer func() { _ = db.Close(context.WithoutCancel(ctx)) }()
	rel := pgx.Identifier{schema, table}.Sanitize()
	exch := "''::text"
	if cfg.ExchangeColumn != "" {
		var has bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2 AND attnum > 0 AND NOT attisdropped)`,
			rel, cfg.ExchangeColumn).Scan(&has)
		if err != nil {
			return recentKeys{}, fmt.Errorf("read the columns of %s: %w", rel, err)
		}
		if has {
			exch = pgx.Identifier{cfg.ExchangeColumn}.Sanitize() + "::text"
		}
	}
	key, id := pgx.Identifier{cfg.RoutingKeyColumn}.Sanitize()+"::text", pgx.Identifier{cfg.IDColumn}.Sanitize()
	// tableoid and ctid tell a row read by both halves from two rows with
	// the same values, whatever type the id has.
	q := fmt.Sprintf(`
		WITH recent AS (
			(SELECT tableoid, ctid, %[1]s AS exch, %[2]s AS key, published_at IS NULL AS unpublished FROM %[3]s ORDER BY %[4]s DESC LIMIT %[5]d)
			UNION
			(SELECT tableoid, ctid, %[1]s, %[2]s, true FROM %[3]s WHERE published_at IS NULL LIMIT %[5]d))
		SELECT coalesce(exch, ''), key, count(*), count(*) FILTER (WHERE unpublished),
		       sum(count(*)) OVER (), count(*) OVER ()
		FROM recent WHERE key IS NOT NULL
		GROUP BY 1, 2 ORDER BY 3 DESC, 2, 1 LIMIT %[6]d`, exch, key, rel, id, recentRows, maxRecentKeys)
	rows, err := db.Query(ctx, q)
	if err != nil {
		return recentKeys{}, fmt.Errorf("read the routing keys of recent rows of %s: %w", rel, err)
	}
	var out recentKeys
	for rows.Next() {
		var k recentKey
		var total, distinct int64
		var n, unpublished int64
		if err := rows.Scan(&k.exchange, &k.key, &n, &unpublished, &total, &distinct); err != nil {
			rows.Close()
			return recentKeys{}, fmt.Errorf("read the routing keys of recent rows of %s: %w", rel, err)
		}
		k.rows, k.unpublished = int(n), int(unpublished)
		out.keys, out.rows, out.distinct = append(out.keys, k), int(total), int(distinct)
	}
	if err := rows.Err(); err != nil {
		return recentKeys{}, fmt.Errorf("read the routing keys of recent rows of %s: %w", rel, err)
	}
	return out, nil
}

// describeRows says how many of the rows read carry a key, for a finding.
func (k recentKey) describeRows(of int) string {
	s := fmt.Sprintf("%d of the %d rows read", k.rows, of)
	if k.unpublished > 0 {
		s += fmt.Sprintf(" (%d of them unpublished)", k.unpublished)
	}
	return s
}

// shellQuote quotes s for a POSIX shell, for a remedy's command line.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
