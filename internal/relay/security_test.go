package relay_test

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// tlsFiles is a CA and a certificate it signed, written where the test and
// the PostgreSQL server user can read them.
type tlsFiles struct {
	dir               string
	ca, cert, key     string // paths
	certPEM, keyPEM   []byte
	caPEM, otherCAPEM []byte
	otherCA           string // path of a CA that signed nothing here
}

func newTLSFiles(t *testing.T) tlsFiles {
	t.Helper()
	ca, err := testenv.NewCA("cdcrelay test CA")
	if err != nil {
		t.Fatal(err)
	}
	other, err := testenv.NewCA("some other CA")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := testenv.WriteServerFiles(map[string][]byte{
		"server.crt": certPEM, "server.key": keyPEM, "ca.pem": ca.PEM, "other-ca.pem": other.PEM,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// The relay (this process, root or not) reads the client-side files.
	client := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(client, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return tlsFiles{
		dir: dir, ca: write("ca.pem", ca.PEM), cert: write("client.crt", certPEM), key: write("client.key", keyPEM),
		certPEM: certPEM, keyPEM: keyPEM, caPEM: ca.PEM, otherCAPEM: other.PEM, otherCA: write("other-ca.pem", other.PEM),
	}
}

func withQuery(t *testing.T, raw string, set map[string]string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	for k, v := range set {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func waitLog(t *testing.T, r *running, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !strings.Contains(r.logs.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the relay never logged %q", want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestIntegrationPostgresTLS: both of the relay's PostgreSQL connections
// (normal and replication) use TLS with sslmode=verify-full; a wrong CA
// fails with a clear error.
func TestIntegrationPostgresTLS(t *testing.T) {
	f := newTLSFiles(t)
	e := newEnv(t, testenv.PostgresOptions{Settings: map[string]string{
		"ssl": "on", "ssl_cert_file": filepath.Join(f.dir, "server.crt"), "ssl_key_file": filepath.Join(f.dir, "server.key"),
	}}, "#")
	verified := withQuery(t, e.relayURL, map[string]string{"sslmode": "verify-full", "sslrootcert": f.ca, "application_name": "relay-tls"})

	bad := e.startRelay(map[string]string{"DATABASE_URL": withQuery(t, verified, map[string]string{"sslrootcert": f.otherCA})})
	waitLog(t, bad, "certificate signed by unknown authority", 30*time.Second)
	if bad.relay.Streaming() {
		t.Fatal("streaming with an untrusted server certificate")
	}
	_ = bad.stop(t)

	r := e.startRelay(map[string]string{"DATABASE_URL": verified})
	r.waitStreaming(t)
	rows, _ := insertTxns(t, e.db, "tls", 20)
	waitAll(t, e.consumer, rows, 30*time.Second)
	waitMarked(t, e, rows, 10*time.Second)
	var plain, encrypted int
	err := e.db.QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE NOT s.ssl), count(*) FILTER (WHERE s.ssl)
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
		WHERE a.usename = 'cdcrelay_app'`).Scan(&plain, &encrypted)
	if err != nil {
		t.Fatal(err)
	}
	if plain != 0 || encrypted < 2 {
		t.Fatalf("relay connections: %d without TLS, %d with; want none without and the replication one among those with", plain, encrypted)
	}
	var walsenderTLS bool
	if err := e.db.QueryRow(context.Background(), `SELECT s.ssl FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid)`).Scan(&walsenderTLS); err != nil || !walsenderTLS {
		t.Fatalf("replication connection TLS %v (%v)", walsenderTLS, err)
	}
}

// TestIntegrationAMQPTLS: amqps:// through a TLS listener in front of the
// local broker that requires a client certificate: the right CA and
// certificate work; a wrong CA or no client certificate fail clearly.
func TestIntegrationAMQPTLS(t *testing.T) {
	f := newTLSFiles(t)
	term, err := testenv.NewTLSTerminator(testenv.AMQPAddr(), f.certPEM, f.keyPEM, f.caPEM)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = term.Close() })
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	amqps := "amqps://guest:guest@" + term.Addr() + "/"

	wrongCA := e.startRelay(map[string]string{"AMQP_URL": amqps, "AMQP_TLS_CA": f.otherCA, "AMQP_TLS_CERT": f.cert, "AMQP_TLS_KEY": f.key})
	waitLog(t, wrongCA, "certificate signed by unknown authority", 30*time.Second)
	_ = wrongCA.stop(t)

	noCert := e.startRelay(map[string]string{"AMQP_URL": amqps, "AMQP_TLS_CA": f.ca})
	waitLog(t, noCert, "connect to broker", 30*time.Second)
	if noCert.relay.Streaming() {
		t.Fatal("streaming without the client certificate the broker requires")
	}
	_ = noCert.stop(t)

	r := e.startRelay(map[string]string{"AMQP_URL": amqps, "AMQP_TLS_CA": f.ca, "AMQP_TLS_CERT": f.cert, "AMQP_TLS_KEY": f.key})
	r.waitStreaming(t)
	rows, _ := insertTxns(t, e.db, "tls", 20)
	waitAll(t, e.consumer, rows, 30*time.Second)
}

// TestIntegrationNoSecretInOutput runs the binary's commands with known
// passwords against failing endpoints (closed ports, a missing database, a
// broker refusing the password) and a working one, in text and JSON logs,
// and searches everything they printed, and /metrics, for the passwords.
func TestIntegrationNoSecretInOutput(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	const dbSecret, mqSecret = "Db-S3cret-pw-91", "Mq-S3cret-pw-72"
	closed := freeAddr(t)
	withPassword := func(raw, user, pw string) string {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(user, pw)
		return u.String()
	}
	dbClosed := "postgres://relay:" + dbSecret + "@" + closed + "/app?sslmode=disable"
	dbMissing := withPassword(strings.Replace(e.relayURL, "/app?", "/nosuchdb?", 1), "cdcrelay_app", dbSecret)
	dbGood := withPassword(e.relayURL, "cdcrelay_app", relayRolePassword)
	mqClosed := "amqp://guest:" + mqSecret + "@" + closed + "/"
	mqRefused := "amqp://guest:" + mqSecret + "@" + testenv.AMQPAddr() + "/"
	kv := "host=127.0.0.1 port=" + strings.Split(closed, ":")[1] + " user=relay password=" + dbSecret + " dbname=app"

	cases := []struct {
		name, cmd, db, mq, format string
	}{
		{"run, both closed", "run", dbClosed, mqClosed, "text"},
		{"run, both closed, json", "run", dbClosed, mqClosed, "json"},
		{"run, key=value dsn", "run", kv, mqClosed, "text"},
		{"run, missing database", "run", dbMissing, mqRefused, "json"},
		{"run, broker refuses the password", "run", dbGood, mqRefused, "text"},
		{"check, both closed", "check", dbClosed, mqClosed, "text"},
		{"check, broker refuses", "check", dbGood, mqRefused, "text"},
		{"migrate, closed", "migrate", dbClosed, mqClosed, "text"},
		{"run, bad config", "run", dbClosed, "http://guest:" + mqSecret + "@x/", "text"},
	}
	secrets := []string{dbSecret, mqSecret, relayRolePassword}
	// Built before any case's clock starts: the first build takes longer
	// than a case's 4 s.
	bin := relayBinary(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addr := freeAddr(t)
			// run keeps retrying until it is killed; check and migrate
			// exit by themselves. A broker that refuses the password
			// answers only after 3 s (RabbitMQ's delay before it closes
			// a refused connection), so check needs room beyond that.
			limit := 4 * time.Second
			if c.cmd != "run" {
				limit = 30 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), limit)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, c.cmd)
			cmd.Env = append(os.Environ(),
				config.Prefix+"DATABASE_URL="+c.db, config.Prefix+"AMQP_URL="+c.mq, config.Prefix+"EXCHANGE="+e.exchange,
				config.Prefix+"HTTP_ADDR="+addr, config.Prefix+"LOG_LEVEL=debug", config.Prefix+"LOG_FORMAT="+c.format,
				config.Prefix+"BACKOFF_MIN=100ms", config.Prefix+"BACKOFF_MAX=200ms")
			out := &testenv.Buffer{}
			cmd.Stdout, cmd.Stderr = out, out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var metrics string
			if c.cmd == "run" {
				time.Sleep(2 * time.Second)
				if code, body := readyzLike(addr, "/metrics"); code == 200 {
					metrics = body
				}
			}
			_ = cmd.Wait()
			if c.cmd != "run" && ctx.Err() != nil {
				t.Fatalf("%s did not exit within %s", c.cmd, limit)
			}
			printed := out.String() + metrics
			if len(strings.TrimSpace(out.String())) == 0 {
				t.Fatal("the command printed nothing; the test would prove nothing")
			}
			for _, s := range secrets {
				if strings.Contains(printed, s) {
					t.Fatalf("output contains a password:\n%s", printed)
				}
			}
		})
	}
}
