package relay

import (
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/wal"

	"github.com/cdcrelay/cdcrelay/internal/pgerr"
)

// A session's error is one of three kinds, decided here:
//   - fatal (IsFatal): a retry would only repeat it and nothing outside the
//     relay's configuration can change that (a slot of the wrong plugin, a
//     poison row with CDCRELAY_POISON=stop): the process ends, non-zero.
//   - needs an operator (an *OperatorError, made by classify and by the
//     checks before a slot is created, operator.go): a password, a
//     certificate, pg_hba.conf, a grant. The relay retries with backoff and
//     says at ERROR and on /readyz what to fix, so that the fix (a new
//     Secret, an ALTER ROLE, a reload) heals it without a restart.
//   - anything else is retried with backoff, quietly, as a transport
//     failure, a nack, a return or a timeout heals by itself.

// IsFatal is the one place that decides whether a session error is worth a
// retry. Transport failures (either side), nacks, returns and timeouts are
// retried forever with backoff, and so is whatever an operator can fix
// (classify); errors that a retry would only repeat end the process with a
// non-zero exit so the operator sees them.
func IsFatal(err error) bool {
	if err == nil {
		return false
	}
	for _, e := range []error{wal.ErrUnsupported, wal.ErrProtocol, wal.ErrSchema, wal.ErrMalformed, slot.ErrSlotMismatch, slot.ErrSlotLost, slot.ErrFailoverUnsupported, slot.ErrSlotServer, slot.ErrPublication, publish.ErrPoison} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// classify turns a failure to connect that only a person can fix into an
// *OperatorError naming the setting to change; any other error is
// returned as it is. Every session error passes through it (session).
func (r *Relay) classify(err error) error {
	if err == nil || errors.As(err, new(*OperatorError)) {
		return err
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		if op := r.postgresOperator(err, ce.Config); op != nil {
			return op
		}
		return err
	}
	if op := brokerOperator(err); op != nil {
		return op
	}
	return err
}

// postgresOperator is the OperatorError for a connection to PostgreSQL
// made with used that failed for a reason only a person can fix
// (pgerr.Diagnose), nil for one a retry may heal.
func (r *Relay) postgresOperator(err error, used *pgconn.Config) *OperatorError {
	setting := r.urlSetting(used)
	// The slot lock's connection goes to CDCRELAY_LOCK_DATABASE with the
	// URL's credentials: a password or a certificate is the URL's to fix,
	// a missing database or its CONNECT grant the lock database's.
	lock := used.Database == r.cfg.LockDatabase && r.urlDatabase(setting) != used.Database
	diagnosed := setting
	var pgErr *pgconn.PgError
	if lock && errors.As(err, &pgErr) && (pgErr.Code == pgerr.InvalidCatalogName || pgErr.Code == pgerr.InsufficientPrivilege) {
		diagnosed = "CDCRELAY_LOCK_DATABASE"
	}
	d := pgerr.Diagnose(err, diagnosed)
	if !d.Operator {
		return nil
	}
	problem := fmt.Sprintf("cannot connect to PostgreSQL as %s with %s", used.User, setting)
	if lock {
		problem += fmt.Sprintf(" (to the slot lock's database %s, CDCRELAY_LOCK_DATABASE, reached with the same credentials)", used.Database)
	}
	return &OperatorError{Problem: problem + ": " + d.Cause, Remedy: d.Remedy, Err: err}
}

// urlSetting names the variable of the URL a connection was made with:
// CDCRELAY_REPLICATION_URL when it names a server CDCRELAY_DATABASE_URL
// does not, else CDCRELAY_DATABASE_URL.
func (r *Relay) urlSetting(used *pgconn.Config) string {
	if r.cfg.ReplicationURL == "" {
		return "CDCRELAY_DATABASE_URL"
	}
	same := func(url string) bool {
		c, err := pgconn.ParseConfig(url)
		return err == nil && c.Host == used.Host && c.Port == used.Port && c.User == used.User
	}
	if same(r.cfg.ReplicationURL) && !same(r.cfg.DatabaseURL) {
		return "CDCRELAY_REPLICATION_URL"
	}
	return "CDCRELAY_DATABASE_URL"
}

// urlDatabase is the database the URL of setting names.
func (r *Relay) urlDatabase(setting string) string {
	url := r.cfg.DatabaseURL
	if setting == "CDCRELAY_REPLICATION_URL" {
		url = r.cfg.ReplicationURL
	}
	c, err := pgconn.ParseConfig(url)
	if err != nil {
		return ""
	}
	return c.Database
}

// brokerOperator is the OperatorError for a broker connection refused for
// a reason only a person can fix, nil for any other error. A certificate
// failure with no PostgreSQL connection in its chain (classify asked
// first) is the broker's: the relay makes TLS connections to nothing else.
func brokerOperator(err error) *OperatorError {
	var problem, remedy string
	switch {
	case errors.Is(err, amqp.ErrCredentials), errors.Is(err, amqp.ErrSASL):
		problem = "the broker refused the user and password of CDCRELAY_AMQP_URL"
		remedy = "check the user and password in CDCRELAY_AMQP_URL (reserved characters percent-encoded), and that the user exists on the broker (rabbitmqctl list_users)"
	case errors.Is(err, amqp.ErrVhost):
		problem = "the broker's user may not use the vhost of CDCRELAY_AMQP_URL"
		remedy = "correct the vhost in CDCRELAY_AMQP_URL (%2F for the default vhost /), or give the user access to it (rabbitmqctl set_permissions -p <vhost> <user> …)"
	case errors.As(err, new(x509.UnknownAuthorityError)), errors.As(err, new(x509.HostnameError)), errors.As(err, new(x509.CertificateInvalidError)):
		problem = "the broker's certificate did not verify"
		remedy = "set CDCRELAY_AMQP_TLS_CA to the CA certificate that signed the broker's certificate, and make sure the certificate is valid and names the host of CDCRELAY_AMQP_URL in its subjectAltName (SAN)"
	default:
		return nil
	}
	return &OperatorError{Problem: problem, Remedy: remedy, Err: err}
}
