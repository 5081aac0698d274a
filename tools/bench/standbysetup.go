package main

// The standby part's world (standby.go runs its phases): a PostgreSQL 16+
// primary and a physical standby of it, and what the bench asks them
// besides the CPU windows.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/svckit/pgcluster"
	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

// setupStandby makes the part's world: a primary of build's binaries with
// the bench database, the outbox and the roles, a physical standby of it,
// and relay settings for it (vars with its DATABASE_URL).
func (b *bench) setupStandby(ctx context.Context, build pgBuild, vars map[string]string) error {
	say("standby part: starting a PostgreSQL %d primary and a physical standby of it", build.major)
	err := withPGBin(build.dir, func() error {
		pg, err := pgcluster.StartPostgres(ctx, pgcluster.PostgresOptions{Log: os.Stderr})
		b.pg = pg
		return err
	})
	if err != nil {
		return err
	}
	pg := b.pg
	b.defer_("remove the standby part's primary", func(context.Context) error { return pg.Close() })
	if err := pg.CreateDatabase(ctx, benchDatabase); err != nil {
		return err
	}
	// Before any connection of ours: making the standby restarts the primary.
	sp, err := pg.StartStandby(ctx, pgcluster.StandbyOptions{Slot: standbyName})
	if err != nil {
		return err
	}
	b.defer_("remove the standby", func(context.Context) error { return sp.Close() })
	if err := b.primaryWorld(ctx); err != nil {
		return err
	}
	b.relayVars = maps.Clone(vars)
	b.relayVars["DATABASE_URL"] = b.relayURL
	return b.connectStandby(ctx, sp)
}

// primaryWorld readies the part's primary as setup readies the main one:
// the outbox, the roles and the inserter; no pg_stat_statements.
func (b *bench) primaryWorld(ctx context.Context) error {
	var err error
	if b.postmaster, err = postmasterPID(b.pg.DataDir()); err != nil {
		return err
	}
	b.superURL = b.pg.URL(benchDatabase)
	if err := runOnce(ctx, b.opts.relay, toolkit.Env(map[string]string{"DATABASE_URL": b.superURL, "LOG_LEVEL": "warn"}), "migrate"); err != nil {
		return err
	}
	if b.db, err = pgx.Connect(ctx, b.superURL); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	b.defer_("close database connection", b.db.Close)
	if _, err := b.db.Exec(ctx, rolesSQL+";"+standbyGrantsSQL); err != nil {
		return fmt.Errorf("roles: %w", err)
	}
	if b.knowsMarkOrigin() {
		if _, err := b.db.Exec(ctx, originGrantsSQL); err != nil {
			return fmt.Errorf("grant the replication origin functions: %w", err)
		}
	}
	if err := b.db.QueryRow(ctx, "SHOW server_version").Scan(&b.res.machine.postgres); err != nil {
		return err
	}
	b.relayURL, b.drainerURL = withUser(b.superURL, relayRole), withUser(b.superURL, drainerRole)
	if b.ins, err = newInserter(ctx, b.superURL); err != nil {
		return err
	}
	b.defer_("close inserter", func(context.Context) error { return b.ins.close() })
	return nil
}

// standbyGrantsSQL: on an idle primary, creating a slot on a standby
// waits for a record of running transactions; the relay asks the primary
// for one (docs/least-privilege.md).
const standbyGrantsSQL = `GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO ` + relayRole

// originGrantsSQL lets the relay's role tag the janitor's transactions
// with a replication origin (CDCRELAY_MARK_ORIGIN), whatever the
// functions' signatures in this release.
const originGrantsSQL = `DO $$ DECLARE f regprocedure; BEGIN
	FOR f IN SELECT oid::regprocedure FROM pg_proc WHERE proname IN
		('pg_replication_origin_oid', 'pg_replication_origin_create', 'pg_replication_origin_session_setup') LOOP
		EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO ` + relayRole + `', f);
	END LOOP; END $$`

// connectStandby waits until the standby has replayed the primary's
// set-up and keeps a connection to it for the CPU windows.
func (b *bench) connectStandby(ctx context.Context, sp *pgcluster.Postgres) error {
	lsn, err := b.pg.CurrentLSN(ctx)
	if err != nil {
		return err
	}
	if err := sp.WaitReplayed(ctx, lsn); err != nil {
		return err
	}
	pm, err := postmasterPID(sp.DataDir())
	if err != nil {
		return err
	}
	db, err := pgx.Connect(ctx, sp.URL(benchDatabase))
	if err != nil {
		return fmt.Errorf("connect to the standby: %w", err)
	}
	b.defer_("close the standby connection", db.Close)
	b.standby = &standbyServer{pg: sp, postmaster: pm, db: db, relayURL: withUser(sp.URL(benchDatabase), relayRole)}
	b.caughtUp = b.walsenderCaughtUp
	b.pacedWatch = b.sampleReplay
	return nil
}

// knowsMarkOrigin says whether the relay binary has CDCRELAY_MARK_ORIGIN
// (its settings' names are strings in the binary).
func (b *bench) knowsMarkOrigin() bool {
	bin, err := os.ReadFile(b.opts.relay)
	return err == nil && bytes.Contains(bin, []byte("MARK_ORIGIN"))
}

// walsenderCaughtUp waits (at most caughtUpWait, then goes on) until the
// relay's walsender has read the WAL up to the primary's position: on a
// standby it decodes the marks only once they are replayed, after the
// primary shows them, and that decoding belongs in the drain's window.
func (b *bench) walsenderCaughtUp(ctx context.Context) error {
	var target string
	if err := b.db.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		return fmt.Errorf("read the primary's WAL position: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, caughtUpWait)
	defer cancel()
	for {
		var done bool
		err := b.slotConn().QueryRow(wctx, `SELECT coalesce(bool_and(sent_lsn >= $1::pg_lsn), false)
			FROM pg_stat_replication WHERE application_name LIKE $2 || '%'`, target, relayApp).Scan(&done)
		switch {
		case done:
			return nil
		case errors.Is(wctx.Err(), context.DeadlineExceeded):
			return nil
		case err != nil:
			return fmt.Errorf("ask whether the walsender read the marks: %w", err)
		}
		select {
		case <-wctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// replaySampling is how often sampleReplay asks the standby.
const replaySampling = 50 * time.Millisecond

// sampleReplay records in b.standby.lags, until ctx ends, how long ago the
// primary committed the last transaction the standby has replayed: while
// commits come every millisecond, that is the replay lag (plus at most the
// gap between commits), the delay a slot on the standby adds to every
// event. Its own connection: sample uses the other one meanwhile.
func (b *bench) sampleReplay(ctx context.Context) {
	db, err := pgx.Connect(ctx, b.standby.pg.URL(benchDatabase))
	if err != nil {
		return
	}
	defer func() { _ = db.Close(context.WithoutCancel(ctx)) }()
	tick := time.NewTicker(replaySampling)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var lag *int64 // NULL before the standby has replayed a commit
		err := db.QueryRow(ctx, `SELECT (extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp()) * 1e6)::bigint`).Scan(&lag)
		if err != nil {
			return
		}
		if lag != nil {
			b.standby.lags = append(b.standby.lags, time.Duration(*lag)*time.Microsecond)
		}
	}
}

// relayOrigins lists the replication origins the relay created on the
// primary (CDCRELAY_MARK_ORIGIN).
func (b *bench) relayOrigins(ctx context.Context) ([]string, error) {
	var names []string
	err := b.db.QueryRow(ctx, `SELECT coalesce(array_agg(roname ORDER BY roname), '{}') FROM pg_replication_origin WHERE roname LIKE $1 || '%'`, relayApp).Scan(&names)
	if err != nil {
		return nil, fmt.Errorf("list replication origins: %w", err)
	}
	return names, nil
}
