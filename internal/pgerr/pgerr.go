// Package pgerr formats PostgreSQL connection errors so that they lead with
// their real cause, and names the SQLSTATE codes the relay tells apart
// (codes.go).
//
// With sslmode=prefer, the default, pgconn first tries TLS and then, when
// the server refuses it, connects without TLS; when that second attempt
// fails too, its error lists both attempts, the TLS refusal first. Every
// failure to connect to a server without TLS (a wrong password, a missing
// database, max_wal_senders) then starts with "server refused TLS
// connection", which sends operators after the wrong problem. Diagnose
// (diagnose.go) gives each cause its remedy.
package pgerr

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// tlsRefused is pgconn's message when the server answers the TLS request
// with "no" (it has ssl = off).
const tlsRefused = "server refused TLS connection"

// Connect returns err unchanged unless it is a pgconn connection error
// whose attempts include TLS refusals and some other failure: then its
// message gives the other failures only, and mentions the refusal only
// where it matters (pg_hba.conf refused the attempt without TLS); or one that says the database does not exist, which gets the
// remedy (the first thing a new user meets when the URL names a database
// nobody created). The original error stays in the chain, so errors.As
// still finds the *pgconn.PgError (its SQLSTATE) and the
// *pgconn.ConnectError.
func Connect(err error) error {
	err = leadWithCause(err)
	var pgErr *pgconn.PgError
	var ce *pgconn.ConnectError
	if errors.As(err, &pgErr) && pgErr.Code == InvalidCatalogName && errors.As(err, &ce) {
		db := pgx.Identifier{ce.Config.Database}.Sanitize()
		return &connectError{err: err, msg: fmt.Sprintf("%v: create it (CREATE DATABASE %s; as a role with CREATEDB), or name the service's database in the URL", err, db)}
	}
	return err
}

// leadWithCause drops the TLS refusals from the message, unless a cause
// is pg_hba.conf's refusal of a connection without TLS (Connect).
func leadWithCause(err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return err
	}
	joined, ok := ce.Unwrap().(interface{ Unwrap() []error })
	if !ok {
		return err // one attempt: nothing to reorder
	}
	var causes []string
	refusals, wantsTLS := 0, false
	for _, attempt := range joined.Unwrap() {
		if tlsRefusal(attempt) {
			refusals++
			continue
		}
		causes = append(causes, attempt.Error())
		wantsTLS = wantsTLS || refusedForNoTLS(attempt)
	}
	if refusals == 0 || len(causes) == 0 {
		return err
	}
	msg := fmt.Sprintf("failed to connect to `user=%s database=%s`: %s", ce.Config.User, ce.Config.Database, strings.Join(causes, "; "))
	if wantsTLS {
		// Only here is the refusal part of the story: pg_hba.conf wants
		// TLS the server does not offer.
		msg += " (an attempt with TLS came first and the server refused it: it has TLS off)"
	}
	return &connectError{msg: msg, err: err}
}

// refusedForNoTLS reports whether an attempt failed because pg_hba.conf
// refuses connections without TLS.
func refusedForNoTLS(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == InvalidAuthorizationSpec && strings.Contains(pgErr.Message, "no encryption")
}

// tlsRefusal reports whether an attempt failed only because the server
// refused TLS.
func tlsRefusal(err error) bool {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error() == tlsRefused
		}
		err = next
	}
}

type connectError struct {
	msg string
	err error
}

func (e *connectError) Error() string { return e.msg }
func (e *connectError) Unwrap() error { return e.err }
