package pgconnect

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// This file makes a connection's commits durable before they return
// (Options.Durable), whatever synchronous_commit says.
//
// The janitor's commits are part of the slot's position: once a mark's
// COMMIT returns, its done lets the slot pass the row, and the relay's
// resume place skips the event (invariant 10, docs/architecture.md). With
// synchronous_commit=off (in postgresql.conf, ALTER DATABASE or ALTER ROLE
// … SET, or the URL's options) COMMIT returns before its WAL is flushed,
// and a crash of the server within the WAL writer's delay (up to three
// times wal_writer_delay) loses the marks while the relay's resume place,
// or the slot's saved position (PostgreSQL saves it with a new restart
// point, flushing no WAL), has passed their rows: they stay unmarked
// behind the slot for good (TestIntegrationMarksDurableUnderAsyncCommit;
// docs/architecture.md, "What the relay remembers": marks written).
//
// Why "local" and not "on" in place of "off": local flushes the commit to
// this server's WAL and waits for no standby, which is what the invariant
// needs here. Where the position that counts after a promotion is on a
// standby (a slot on CDCRELAY_REPLICATION_URL's standby, a failover slot
// synced to synchronized_standby_slots), the janitor waits for that standby
// itself (janitor/replica.go, janitor/standbys.go), and a walsender sends
// only flushed WAL, so those waits also imply the local flush. "on" would,
// with synchronous_standby_names set, make every mark wait for standbys the
// operator's own writers do not wait for (they commit with off), and a
// stalled synchronous standby would then hold the slot back and degrade the
// relay for no guarantee the invariant needs.
//
// Why any other setting is kept (local, remote_write, on, remote_apply):
// the operator asked that commits wait for a synchronous standby; the marks
// then wait for it as the outbox rows do, so a failover to it loses no mark
// of a row it has, and the relay behaves as it always did there (its tests
// of commits held by a synchronous standby run with on).
//
// The value is set in the session even when it is kept: a SET outranks a
// later reload of postgresql.conf or ALTER SYSTEM, which would otherwise
// turn an open connection's commits asynchronous for the rest of its life
// (a janitor under steady load keeps its connection for days).

// durableSQL sets the session's synchronous_commit to what it is now, or
// to local if that is off.
const durableSQL = `SELECT set_config('synchronous_commit',
	CASE current_setting('synchronous_commit') WHEN 'off' THEN 'local' ELSE current_setting('synchronous_commit') END, false)`

// durable pins db's synchronous_commit at local or stronger (durableSQL).
func durable(ctx context.Context, db *pgx.Conn) error {
	if _, err := db.Exec(ctx, durableSQL); err != nil {
		return fmt.Errorf("make the session's commits durable (synchronous_commit): %w", err)
	}
	return nil
}
