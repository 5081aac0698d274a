package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/pgerr"
	"github.com/cdcrelay/cdcrelay/internal/preflight"
)

// This file names the conditions that time does not heal and an operator
// can: a role without REPLICATION, without SELECT on the outbox, a server
// without wal_level=logical, and the connections refused for a password,
// a certificate, pg_hba.conf or a grant (classify, errors.go). The relay
// keeps checking with its backoff, since the fix (a GRANT, an ALTER ROLE,
// a new Secret, a restart of PostgreSQL) needs no restart of the relay,
// and says so at ERROR with the remedy, and on /readyz; and it creates
// nothing while they hold, so that retries do not create and drop a slot
// each time (docs/runbook.md, "The first five minutes").

// OperatorError is a condition only an operator can fix.
type OperatorError struct {
	Problem string // what is wrong, for a person
	Remedy  string // what to run or change
	Err     error  // the server's own error, if there was one
}

func (e *OperatorError) Error() string {
	msg := e.Problem + "; needs an operator (the relay checks again with backoff until someone fixes it): " + e.Remedy
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// waitMessage is the ERROR line's message while the relay waits for an
// operator: what is wrong and when it looks again, which is soon (the
// backoff) since the fix needs no restart of the relay.
func (e *OperatorError) waitMessage(wait time.Duration) string {
	return fmt.Sprintf("needs an operator: %s; checking again in %s, and then with backoff, until someone fixes it", e.Problem, wait.Round(time.Millisecond))
}

func (e *OperatorError) Unwrap() error { return e.Err }

// needsOperator is the relay's error for a finding of check's.
func needsOperator(f preflight.Finding, err error) *OperatorError {
	return &OperatorError{Problem: f.Message, Remedy: f.Remedy, Err: err}
}

// replicationDenied turns the server's refusal of a replication connection
// to a role without the REPLICATION attribute into an OperatorError.
func replicationDenied(err error, role string) error {
	// 42501 on connecting also means no CONNECT on the database: only
	// the walsender's refusal is about REPLICATION ("permission denied to
	// start WAL sender", before 16 "must be superuser or replication role
	// to start walsender").
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerr.InsufficientPrivilege ||
		!strings.Contains(strings.ReplaceAll(strings.ToLower(pgErr.Message), " ", ""), "walsender") {
		return err
	}
	return needsOperator(preflight.NoReplication(role), err)
}

// canAdopt is asked before a slot (or its adoption marker) is created:
// logical decoding needs wal_level=logical on the slot's server, and the
// adoption reads the backlog from the new slot's snapshot, which needs
// SELECT on the outbox. Checked first, a missing one costs no slot. The
// findings are check's own (internal/preflight).
func (r *Relay) canAdopt(ctx context.Context, sdb *pgx.Conn) error {
	table := pgx.Identifier{r.outbox.Schema, r.outbox.Table}.Sanitize()
	var level, role string
	var pending, canSelect bool
	// A table the slot's standby has not replayed yet is waited for
	// later (awaitReplay), not judged here. pending_restart: an ALTER
	// SYSTEM already made and reloaded, whose remedy is the restart.
	err := sdb.QueryRow(ctx, `SELECT s.setting, s.pending_restart, current_user, coalesce(has_table_privilege(to_regclass($1), 'SELECT'), true)
		FROM pg_settings s WHERE s.name = 'wal_level'`, table).
		Scan(&level, &pending, &role, &canSelect)
	if err != nil {
		return fmt.Errorf("read wal_level and the SELECT grant on %s: %w", table, err)
	}
	if f := preflight.ClassifyWALLevel(level, pending); f.Severity != preflight.OK {
		return needsOperator(f, nil)
	}
	if !canSelect {
		return needsOperator(preflight.NoSelect(r.outbox.Schema, r.outbox.Table, role), nil)
	}
	return nil
}
