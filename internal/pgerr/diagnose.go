package pgerr

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Diagnosis says what a failed connection needs: the remedy, and whether
// only a person can give it. Check prints the remedy with its finding;
// the relay waits as needs_operator on an Operator diagnosis (retrying
// with backoff, so that a fixed Secret or pg_hba.conf heals it without a
// restart) and retries any other quietly.
type Diagnosis struct {
	// Cause is the server's or the TLS library's own words, short (no
	// "failed to connect to …" preamble), for a status line.
	Cause  string
	Remedy string
	// Operator: a retry repeats the failure until someone changes the
	// URL, a certificate, the role or pg_hba.conf.
	Operator bool
}

// Diagnose classifies err, an error connecting to PostgreSQL (as Connect
// returns it), for the URL of setting (e.g. CDCRELAY_DATABASE_URL), which
// the remedies name. It is the one place that tells the causes apart, for
// check and for the relay alike.
func Diagnose(err error, setting string) Diagnosis {
	if d, ok := diagnoseTLS(err, setting); ok {
		return d
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return Diagnosis{Cause: lastCause(err),
			Remedy: fmt.Sprintf("check that PostgreSQL runs and is reachable at the host and port in %s (firewall, DNS)", setting)}
	}
	d := Diagnosis{Cause: pgErr.Message, Operator: true}
	switch pgErr.Code {
	case InvalidPassword:
		d.Remedy = "check the user and password in " + setting
	case InvalidAuthorizationSpec:
		d.Remedy = authorizationRemedy(err, pgErr, setting)
	case InvalidCatalogName:
		d.Remedy = "check the database name in " + setting + ", or create the database"
	case InsufficientPrivilege:
		d.Remedy = "grant the role CONNECT on the database (GRANT CONNECT ON DATABASE …)"
	case TooManyConnections:
		d.Operator = false // other clients come and go
		d.Remedy = "the server is out of connection slots: raise max_connections (or max_wal_senders for a replication connection), or lower other clients' pools"
	case CannotConnectNow, AdminShutdown, CrashShutdown:
		d.Operator = false // the server is starting or stopping
		d.Remedy = "wait for PostgreSQL to finish starting or stopping"
	default:
		d.Operator = false
		d.Remedy = "see the server log for SQLSTATE " + pgErr.Code
	}
	return d
}

// authorizationRemedy is the remedy for 28000: the role may not log in,
// or pg_hba.conf refuses (an explicit reject, or no line matches). A
// refusal of a connection without TLS is the usual sign of a server that
// wants TLS (hostssl lines, hostnossl … reject): the fix is then the URL's
// sslmode, not pg_hba.conf.
func authorizationRemedy(err error, pgErr *pgconn.PgError, setting string) string {
	hba := "allow this user, database and address in pg_hba.conf, then SELECT pg_reload_conf();"
	switch {
	case strings.Contains(pgErr.Message, "not permitted to log in"):
		var ce *pgconn.ConnectError
		role := "…"
		if errors.As(err, &ce) {
			role = pgx.Identifier{ce.Config.User}.Sanitize()
		}
		return fmt.Sprintf("ALTER ROLE %s LOGIN;", role)
	case !strings.Contains(pgErr.Message, "no encryption"):
		return hba
	case tlsRefusedAttempt(err):
		return "pg_hba.conf admits this connection only with TLS, but the server has TLS off (it refused the TLS attempt): turn ssl on in postgresql.conf (with a certificate), or " + hba
	}
	return fmt.Sprintf("set sslmode=require in %s (or verify-full with sslrootcert, to check the server's certificate too); to admit it without TLS instead, allow it in pg_hba.conf and SELECT pg_reload_conf();", setting)
}

// diagnoseTLS recognises a TLS failure: a server certificate that did not
// verify (sslmode=verify-ca or verify-full), or a server without TLS where
// the URL requires it.
func diagnoseTLS(err error, setting string) (Diagnosis, bool) {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	check := "; sslrootcert in " + setting + " must be the CA certificate that signed the server's certificate"
	switch {
	case errors.As(err, &host):
		d := Diagnosis{Cause: host.Error(), Operator: true,
			Remedy: fmt.Sprintf("the server's certificate does not name the host of %s in its subjectAltName (SAN): reissue it with that name, or connect with a name it lists", setting)}
		if strings.Contains(host.Error(), "legacy Common Name") {
			d.Remedy = fmt.Sprintf("the server's certificate names its host only in the Common Name, which verification ignores: reissue it with the host of %s in its subjectAltName (SAN)", setting)
		}
		d.Remedy += check
		return d, true
	case errors.As(err, &unknown):
		return Diagnosis{Cause: unknown.Error(), Operator: true,
			Remedy: fmt.Sprintf("set sslrootcert in %s to the CA certificate that signed the server's certificate (sslmode=verify-full checks the server against it)", setting)}, true
	case errors.As(err, &invalid):
		return Diagnosis{Cause: invalid.Error(), Operator: true,
			Remedy: "the server's certificate is not valid (expired, not yet valid, or not for a server): renew it" + check}, true
	}
	if refusedOnly(err) {
		return Diagnosis{Cause: tlsRefused, Operator: true,
			Remedy: fmt.Sprintf("the server has TLS off while the sslmode of %s requires it: turn ssl on in postgresql.conf (with a certificate), or change sslmode", setting)}, true
	}
	return Diagnosis{}, false
}

// attempts are the connection attempts of err (one, or those of sslmode=prefer
// and of a multi-host URL), nil when it is no connection error.
func attempts(err error) []error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return nil
	}
	// ConnectError's own cause: pgconn joins the attempts there, one
	// level down, never deeper.
	inner := ce.Unwrap()
	if inner == nil {
		return nil
	}
	if joined, ok := inner.(interface{ Unwrap() []error }); ok {
		return joined.Unwrap()
	}
	return []error{inner}
}

// tlsRefusedAttempt reports whether one of err's attempts was a TLS
// request the server refused.
func tlsRefusedAttempt(err error) bool {
	for _, a := range attempts(err) {
		if tlsRefusal(a) {
			return true
		}
	}
	return false
}

// refusedOnly reports whether every attempt of err was a TLS request the
// server refused.
func refusedOnly(err error) bool {
	as := attempts(err)
	for _, a := range as {
		if !tlsRefusal(a) {
			return false
		}
	}
	return len(as) > 0
}

// lastCause is the innermost message of err: "connection refused" rather
// than the dial's preamble.
func lastCause(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error()
		}
		err = next
	}
}
