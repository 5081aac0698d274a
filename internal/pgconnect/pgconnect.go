// Package pgconnect opens every PostgreSQL connection the relay makes
// (replication, slot lock, session, janitor, monitor, retention, migrate)
// in one place, Connect: each carries the relay's application_name in
// pg_stat_activity and UTF8, the set-up its role needs (a lock holder's
// keepalives and session settings, another database, a replication
// origin), one timeout rule, and an error that names the role; a malformed
// URL is reported the same way everywhere, without quoting it.
package pgconnect

import (
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ApplicationName is the application_name of the relay's connections
// unless the URL sets one. A synchronous_standby_names entry matching it
// would make every commit wait for the broker (preflight checks that).
const ApplicationName = "cdcrelay"

// ErrParse replaces the parser's error, which may quote the URL and with
// it the password. Connect's and ConnectReplication's errors wrap it when
// the URL does not parse (cdcrelay check reports that case by itself).
var ErrParse = errors.New("parse CDCRELAY_DATABASE_URL: not a valid connection string")

// Config parses url for a pgx connection. application_name (ApplicationName)
// and each of params are set unless the URL sets them; client_encoding is
// always UTF8.
func Config(url string, params map[string]string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, ErrParse
	}
	setDefaults(cfg.RuntimeParams, params)
	return cfg, nil
}

// ReplicationConfig parses url for a pgconn connection (the replication
// connection), as Config does.
func ReplicationConfig(url string, params map[string]string) (*pgconn.Config, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, ErrParse
	}
	setDefaults(cfg.RuntimeParams, params)
	return cfg, nil
}

func setDefaults(rt, params map[string]string) {
	if _, set := rt["application_name"]; !set {
		rt["application_name"] = ApplicationName
	}
	// Always UTF8, whatever the URL says: the server (and pgoutput on the
	// replication connection) converts text to the client encoding, which
	// defaults to the database's, so in a LATIN1 database the stream would
	// carry LATIN1 bodies and routing keys, and header strings would not be
	// valid JSON text. With UTF8 both paths read the same UTF-8 bytes
	// (docs/messages.md, "Encodings").
	rt["client_encoding"] = "UTF8"
	for k, v := range params {
		if _, set := rt[k]; !set {
			rt[k] = v
		}
	}
}
