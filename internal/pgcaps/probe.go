package pgcaps

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// probeSQL reads, in one round trip, everything Caps holds.
const probeSQL = `SELECT current_setting('server_version_num')::int, pg_is_in_recovery(), pg_postmaster_start_time()`

// Probe asks db's server for its version, whether it is a standby and
// when it started. A caller that holds a connection for a while (a relay
// session, a check run, a janitor connection) probes once and hands the
// result on.
func Probe(ctx context.Context, db *pgx.Conn) (Caps, error) {
	var c Caps
	if err := db.QueryRow(ctx, probeSQL).Scan(&c.Version, &c.InRecovery, &c.Started); err != nil {
		return Caps{}, fmt.Errorf("read server version: %w", err)
	}
	return c, nil
}
