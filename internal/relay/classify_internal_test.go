package relay

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgerr"
)

// connectErr is a failed connection as pgconn reports it: a
// *pgconn.ConnectError for the configuration used, over the server's
// error (pgconn's own type cannot be built with a cause outside it).
type connectErr struct {
	ce  *pgconn.ConnectError
	err error
}

func (e connectErr) Error() string { return "failed to connect: " + e.err.Error() }
func (e connectErr) Unwrap() error { return e.err }
func (e connectErr) As(target any) bool {
	if p, ok := target.(**pgconn.ConnectError); ok {
		*p = e.ce
		return true
	}
	return false
}

// TestClassify: every refusal only a person can fix becomes an
// OperatorError naming the variable to change (the slot lock's database
// reached with CDCRELAY_DATABASE_URL's credentials is the URL's to fix);
// the others are left for a quiet retry, and none is fatal.
func TestClassify(t *testing.T) {
	r := &Relay{cfg: config.Config{
		DatabaseURL: "postgres://relay:pw@db:5432/app", ReplicationURL: "postgres://relay:pw@standby:5432/app", LockDatabase: "postgres",
	}}
	used := func(host, database string) *pgconn.Config {
		c, err := pgconn.ParseConfig(fmt.Sprintf("postgres://relay@%s:5432/%s", host, database))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	failed := func(c *pgconn.Config, code, msg string) error {
		return fmt.Errorf("connect to somewhere: %w", connectErr{ce: &pgconn.ConnectError{Config: c}, err: &pgconn.PgError{Severity: "FATAL", Code: code, Message: msg}})
	}
	wrongPassword := `password authentication failed for user "relay"`
	for _, tc := range []struct {
		name            string
		err             error
		problem, remedy string // "" problem: not an operator's
	}{
		{"lock, wrong password", failed(used("db", "postgres"), pgerr.InvalidPassword, wrongPassword),
			"cannot connect to PostgreSQL as relay with CDCRELAY_DATABASE_URL (to the slot lock's database postgres, CDCRELAY_LOCK_DATABASE, reached with the same credentials): " + wrongPassword,
			"check the user and password in CDCRELAY_DATABASE_URL"},
		{"service database, wrong password", failed(used("db", "app"), pgerr.InvalidPassword, wrongPassword),
			"cannot connect to PostgreSQL as relay with CDCRELAY_DATABASE_URL: " + wrongPassword, "check the user and password in CDCRELAY_DATABASE_URL"},
		{"standby, wrong password", failed(used("standby", "app"), pgerr.InvalidPassword, wrongPassword),
			"cannot connect to PostgreSQL as relay with CDCRELAY_REPLICATION_URL: ", "check the user and password in CDCRELAY_REPLICATION_URL"},
		{"lock database missing", failed(used("db", "postgres"), pgerr.InvalidCatalogName, `database "postgres" does not exist`),
			"(to the slot lock's database postgres", "check the database name in CDCRELAY_LOCK_DATABASE"},
		{"pg_hba refuses no TLS", failed(used("db", "app"), pgerr.InvalidAuthorizationSpec, `pg_hba.conf rejects connection for host "10.0.0.1", user "relay", database "app", no encryption`),
			"with CDCRELAY_DATABASE_URL: pg_hba.conf rejects", "set sslmode=require in CDCRELAY_DATABASE_URL"},
		{"certificate", fmt.Errorf("connect: %w", connectErr{ce: &pgconn.ConnectError{Config: used("db", "app")}, err: fmt.Errorf("tls: %w", x509.UnknownAuthorityError{})}),
			"with CDCRELAY_DATABASE_URL: x509: certificate signed by unknown authority", "set sslrootcert in CDCRELAY_DATABASE_URL"},
		{"max_wal_senders", failed(used("db", "app"), pgerr.TooManyConnections, "number of requested standby connections exceeds max_wal_senders (currently 1)"), "", ""},
		{"refused port", fmt.Errorf("connect: %w", connectErr{ce: &pgconn.ConnectError{Config: used("db", "app")}, err: errors.New("dial tcp: connection refused")}), "", ""},
		{"broker password", fmt.Errorf("connect to broker: %w", amqp.ErrCredentials),
			"the broker refused the user and password of CDCRELAY_AMQP_URL", "check the user and password in CDCRELAY_AMQP_URL"},
		{"broker vhost", fmt.Errorf("connect to broker: %w", amqp.ErrVhost), "may not use the vhost of CDCRELAY_AMQP_URL", "rabbitmqctl set_permissions"},
		{"broker certificate", fmt.Errorf("connect to broker: %w", x509.HostnameError{Certificate: &x509.Certificate{}, Host: "mq"}),
			"the broker's certificate did not verify", "CDCRELAY_AMQP_TLS_CA"},
		{"broker gone", fmt.Errorf("connect to broker: %w", amqp.ErrClosed), "", ""},
	} {
		got := r.classify(tc.err)
		if IsFatal(got) {
			t.Errorf("%s: fatal: %v", tc.name, got)
		}
		var op *OperatorError
		if !errors.As(got, &op) {
			if tc.problem != "" {
				t.Errorf("%s: not an operator's: %v", tc.name, got)
			} else if got != tc.err { //nolint:errorlint // the very error, unchanged, not one wrapping it
				t.Errorf("%s: changed: %v", tc.name, got)
			}
			continue
		}
		if tc.problem == "" || !strings.Contains(op.Problem, tc.problem) || !strings.Contains(op.Remedy, tc.remedy) || !errors.Is(got, errors.Unwrap(tc.err)) {
			t.Errorf("%s: problem %q, remedy %q; want %q and %q, and the cause kept", tc.name, op.Problem, op.Remedy, tc.problem, tc.remedy)
		}
	}
	already := &OperatorError{Problem: "p", Remedy: "r"}
	if got := r.classify(fmt.Errorf("x: %w", already)); !errors.Is(got, already) {
		t.Errorf("an OperatorError was replaced: %v", got)
	}
}

// TestOperatorWording: what the relay says while it waits for an operator
// says that it looks again, and when, never that a retry cannot help.
func TestOperatorWording(t *testing.T) {
	op := &OperatorError{Problem: "wal_level is replica", Remedy: "ALTER SYSTEM SET wal_level = logical", Err: errors.New("server said so")}
	for _, s := range []string{op.Error(), op.waitMessage(262 * time.Millisecond)} {
		if strings.Contains(s, "cannot fix") || strings.Contains(s, "a retry cannot") {
			t.Errorf("self-contradictory: %s", s)
		}
		if !strings.Contains(s, "needs an operator") || !strings.Contains(s, "until someone fixes it") {
			t.Errorf("does not say it waits for a person: %s", s)
		}
	}
	if got, want := op.waitMessage(262*time.Millisecond), "needs an operator: wal_level is replica; checking again in 262ms, and then with backoff, until someone fixes it"; got != want {
		t.Errorf("waitMessage = %q, want %q", got, want)
	}
}
