package preflight_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestCheckBinary runs the built `cdcrelay check` end to end: exit 0 on a
// good database, 1 with the finding on stdout on a bad one, no password in
// either stream.
func TestCheckBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "cdcrelay")
	build := exec.Command("go", "build", "-o", bin, "./cmd/cdcrelay")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	amqpURL := testenv.RequireAMQP(t)
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{Settings: map[string]string{"max_slot_wal_keep_size": "1GB"}})

	run := func(t *testing.T, f *fixture, args ...string) (code int, stdout, stderr string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, config.Prefix) {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		for k, v := range f.vars(nil) {
			cmd.Env = append(cmd.Env, config.Prefix+k+"="+v)
		}
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit):
			code = exit.ExitCode()
		case err != nil:
			t.Fatal(err)
		}
		t.Logf("cdcrelay %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, o.String(), e.String())
		if strings.Contains(o.String()+e.String(), rolePassword) {
			t.Fatal("output contains the password")
		}
		return code, o.String(), e.String()
	}

	t.Run("good", func(t *testing.T) {
		code, stdout, _ := run(t, newFixture(t, pg, amqpURL), "check")
		if code != 0 || !strings.Contains(stdout, "\n0 errors, 0 warnings, ") {
			t.Fatalf("exit %d", code)
		}
	})
	t.Run("missing publication", func(t *testing.T) {
		code, stdout, stderr := run(t, newFixture(t, pg, amqpURL, `DROP PUBLICATION cdcrelay_outbox`), "check")
		if code != 1 || !strings.Contains(stdout, "ERROR  publication") || !strings.Contains(stderr, "cdcrelay: check: 1 error(s)") {
			t.Fatalf("exit %d", code)
		}
	})
	t.Run("usage", func(t *testing.T) {
		code, _, stderr := run(t, newFixture(t, pg, amqpURL))
		if code != 2 || !strings.Contains(stderr, "\n  check ") {
			t.Fatalf("exit %d, usage without check", code)
		}
	})
}
