package relay_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// Connections refused for a reason only a person can fix (a password, a
// certificate, pg_hba.conf), on either side, wait as needs_operator like
// a missing grant: the relay keeps checking with its backoff, /readyz and
// cdcrelay_status say so with the remedy, which names the variable to
// change, and a fix heals it without a restart of the relay.

// waitRefused waits until the relay's status says it needs an operator
// with each of want in it, twice at ERROR in the log, and checks that it
// did not exit, that cdcrelay_status agrees, and that no password leaked.
func waitRefused(t *testing.T, r *running, want ...string) {
	t.Helper()
	r.WaitFor(t, time.Minute, "needs an operator: "+strings.Join(want, " … "), func() bool {
		s := r.relay.Status()
		for _, w := range want {
			if !strings.Contains(s, w) {
				return false
			}
		}
		n := 0
		for line := range strings.SplitSeq(r.logs.String(), "\n") {
			if strings.Contains(line, "level=ERROR") && strings.Contains(line, "needs an operator") && strings.Contains(line, want[len(want)-1]) {
				n++
			}
		}
		return strings.HasPrefix(s, "starting: needs an operator: ") && n >= 2
	})
	t.Logf("status: %s", r.relay.Status())
	if exited, err := r.Exited(); exited {
		t.Fatalf("the relay exited (%v): it must wait for the operator", err)
	}
	if got := statusReason(t, r.reg); got != "needs_operator" {
		t.Errorf("cdcrelay_status says %q, want needs_operator", got)
	}
	if strings.Contains(r.logs.String()+r.relay.Status(), "wrong-pw-") || strings.Contains(r.relay.Status(), "…") {
		t.Errorf("a password in the log or status, or the remedy clipped: %s", r.relay.Status())
	}
	if strings.Contains(r.logs.String(), "a retry cannot fix this") || strings.Contains(r.relay.Status(), "is reachable") {
		t.Error("the wording contradicts the retries, or the remedy points at the network")
	}
}

// passwordOnly makes cdcrelay_app log in over TCP with its password
// (initdb's trust would take any).
func passwordOnly(t *testing.T, e *env, hba string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(e.pg.DataDir(), "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(context.Background(), `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
}

func withPassword(t *testing.T, raw, password string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String()
}

// TestIntegrationNeedsOperatorDatabasePassword: a wrong password in
// CDCRELAY_DATABASE_URL is named as that (not as the slot lock's database,
// which the relay reaches first with the same credentials), and the relay
// streams once the role's password matches, without a restart.
func TestIntegrationNeedsOperatorDatabasePassword(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	passwordOnly(t, e, "local all all trust\nhost all cdcrelay_app 127.0.0.1/32 scram-sha-256\nhost all all 127.0.0.1/32 trust\n")
	const wrong = "wrong-pw-db-17"
	r := e.startRelay(map[string]string{"DATABASE_URL": withPassword(t, e.relayURL, wrong)})
	waitRefused(t, r, "cannot connect to PostgreSQL as cdcrelay_app with CDCRELAY_DATABASE_URL", "password authentication failed",
		"check the user and password in CDCRELAY_DATABASE_URL")
	if _, err := e.db.Exec(context.Background(), `ALTER ROLE cdcrelay_app PASSWORD '`+wrong+`'`); err != nil {
		t.Fatal(err)
	}
	r.waitStreaming(t)
	rows, _ := insertTxns(t, e.db, "orders.created", 2)
	testenv.WaitCount(t, e.consumer, len(rows), time.Minute)
}

// TestIntegrationNeedsOperatorPostgresTLS: against a server with TLS, a
// URL without TLS that pg_hba.conf refuses (hostnossl … reject) is sent to
// sslmode, and a certificate from another CA to sslrootcert; neither to
// pg_hba.conf or the network.
func TestIntegrationNeedsOperatorPostgresTLS(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	f := newTLSFiles(t)
	e := newEnv(t, testenv.PostgresOptions{Settings: map[string]string{
		"ssl": "on", "ssl_cert_file": filepath.Join(f.dir, "server.crt"), "ssl_key_file": filepath.Join(f.dir, "server.key"),
	}}, "#")
	passwordOnly(t, e, "local all all trust\nhostnossl all cdcrelay_app 127.0.0.1/32 reject\nhost all all 127.0.0.1/32 trust\n")

	plain := e.startRelay(map[string]string{"DATABASE_URL": withQuery(t, e.relayURL, map[string]string{"sslmode": "disable"})})
	waitRefused(t, plain, "pg_hba.conf rejects connection", "no encryption", "set sslmode=require in CDCRELAY_DATABASE_URL")
	_ = plain.stop(t)

	wrongCA := e.startRelay(map[string]string{"DATABASE_URL": withQuery(t, e.relayURL, map[string]string{"sslmode": "verify-full", "sslrootcert": f.otherCA})})
	waitRefused(t, wrongCA, "certificate signed by unknown authority", "set sslrootcert in CDCRELAY_DATABASE_URL")
	_ = wrongCA.stop(t)
}

// TestIntegrationNeedsOperatorBrokerPassword: the local broker refusing
// guest's password waits as needs_operator, as a wrong database password
// does (the broker's users are left as they are).
func TestIntegrationNeedsOperatorBrokerPassword(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	r := e.startRelay(map[string]string{"AMQP_URL": withPassword(t, e.amqpURL, "wrong-pw-mq-29")})
	waitRefused(t, r, "the broker refused the user and password of CDCRELAY_AMQP_URL", "check the user and password in CDCRELAY_AMQP_URL")
}
