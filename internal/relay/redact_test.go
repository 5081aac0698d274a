package relay_test

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationNoQueryPasswordInOutput is TestIntegrationNoSecretInOutput
// for every other form in which pgx takes a password: ?password= and
// ?sslpassword= URL parameters, key=value password and sslpassword,
// multi-host URLs and percent-encoded passwords (and a percent-encoded
// broker password). Each runs the binary's commands against failing
// endpoints (a closed port, a host that does not resolve, a broker that
// refuses the password) and a working database, in text and JSON logs, and
// searches everything printed, and /metrics, for any form of the
// passwords. Every secret below contains "S3cret" and nothing else printed
// does, so finding that word anywhere is a leak.
func TestIntegrationNoQueryPasswordInOutput(t *testing.T) {
	t.Parallel() // long and mostly waiting: see main_test.go
	e := newEnv(t, testenv.PostgresOptions{}, "#")
	closed := freeAddr(t)
	_, closedPort, _ := strings.Cut(closed, ":")
	good, err := url.Parse(e.relayURL)
	if err != nil {
		t.Fatal(err)
	}
	good.User = url.User("cdcrelay_app") // the password goes in a parameter instead
	goodQuery := func(params string) string { return good.String() + "&" + params }
	if !strings.Contains(good.String(), "?") {
		goodQuery = func(params string) string { return good.String() + "?" + params }
	}
	mqRefused := "amqp://guest:Mq%2FS3cret%40pct-21@" + testenv.AMQPAddr() + "/"
	mqClosed := "amqp://guest:Mq-S3cret-22@" + closed + "/"

	cases := []struct {
		name, cmd, db, mq, format string
	}{
		{"run, ?password=, closed port", "run", "postgres://relay@" + closed + "/app?sslmode=disable&password=Qpw-S3cret-11", mqClosed, "text"},
		{"run, ?sslpassword=, closed port, json", "run", "postgres://relay@" + closed + "/app?sslpassword=Sslpw-S3cret-12&sslmode=disable", mqClosed, "json"},
		{"run, key=value password and sslpassword", "run",
			"host=127.0.0.1 port=" + closedPort + " user=relay password=Kvpw-S3cret-13 sslpassword='Kv ssl S3cret-14' dbname=app sslmode=disable", mqClosed, "text"},
		{"run, multi-host, one host unresolvable", "run",
			"postgres://relay:Mh-S3cret-15@nosuchhost.invalid:5432," + closed + "/app?sslmode=disable&connect_timeout=2", mqClosed, "json"},
		{"run, percent-encoded password", "run", "postgres://relay:Pct%2FS3cret%40x-16@" + closed + "/app?sslmode=disable", mqRefused, "text"},
		{"run, working database, ?password= and ?sslpassword=, broker refuses", "run",
			goodQuery("password=" + url.QueryEscape(relayRolePassword) + "&sslpassword=Good-S3cret-17"), mqRefused, "text"},
		{"run, working database and broker, ?password=", "run",
			goodQuery("password=" + url.QueryEscape(relayRolePassword) + "&sslpassword=Good-S3cret-18"), e.amqpURL, "json"},
		{"check, ?password= and ?sslpassword=, closed port", "check",
			"postgres://relay@" + closed + "/app?sslmode=disable&password=Qpw-S3cret-19&sslpassword=Sslpw-S3cret-20", mqClosed, "text"},
		{"check, key=value sslpassword", "check",
			"host=127.0.0.1 port=" + closedPort + " user=relay sslpassword=Kvssl-S3cret-23 password=Kvpw-S3cret-24 dbname=app", mqRefused, "text"},
		{"check, working database, ?password=", "check",
			goodQuery("password=" + url.QueryEscape(relayRolePassword) + "&sslpassword=Good-S3cret-25"), mqRefused, "text"},
		{"migrate, ?password=, closed port", "migrate", "postgres://relay@" + closed + "/app?password=Qpw-S3cret-26", mqClosed, "text"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			printed := redactTestRun(t, c.cmd, c.db, c.mq, c.format, e.exchange)
			for _, s := range []string{"S3cret", relayRolePassword, url.QueryEscape(relayRolePassword)} {
				if strings.Contains(printed, s) {
					t.Fatalf("output contains %q:\n%s", s, printed)
				}
			}
			// Redacted, not silent: the endpoint is still named.
			if c.cmd != "migrate" && !strings.Contains(printed, "xxxxx") {
				t.Fatalf("no redacted connection string in the output:\n%s", printed)
			}
		})
	}
}

// redactTestRun runs one command of the relay binary and returns
// everything it printed, and for run its /metrics: run is stopped with
// SIGTERM once it has been up for a second and a half (several failed
// attempts with these backoffs), check and migrate end on their own.
func redactTestRun(t *testing.T, command, db, mq, format, exchange string) string {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(relayBinary(t), command)
	cmd.Env = append(os.Environ(),
		config.Prefix+"DATABASE_URL="+db, config.Prefix+"AMQP_URL="+mq, config.Prefix+"EXCHANGE="+exchange,
		config.Prefix+"HTTP_ADDR="+addr, config.Prefix+"LOG_LEVEL=debug", config.Prefix+"LOG_FORMAT="+format,
		config.Prefix+"BACKOFF_MIN=100ms", config.Prefix+"BACKOFF_MAX=200ms")
	out := &testenv.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	var metrics string
	if command == "run" {
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(out.String(), "starting") {
			if time.Now().After(deadline) {
				t.Fatalf("run never logged starting:\n%s", out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(1500 * time.Millisecond)
		code, body := readyzLike(addr, "/metrics")
		if code != 200 {
			t.Fatalf("/metrics: %d %s\n%s", code, body, out.String())
		}
		metrics = body
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s still running after 30s:\n%s", command, out.String())
	}
	if len(strings.TrimSpace(out.String())) == 0 {
		t.Fatal("the command printed nothing; the test would prove nothing")
	}
	return fmt.Sprintf("%s\n--- /metrics ---\n%s", out.String(), metrics)
}
