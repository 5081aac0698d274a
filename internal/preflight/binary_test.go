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

// TestIntegrationCheckBinary runs the built `cdcrelay check` end to end: exit 0 on a
// good database, 1 with the finding on stdout on a bad one, no password in
// either stream.
func TestIntegrationCheckBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "cdcrelay")
	build := exec.Command("go", "build", "-o", bin, "./cmd/cdcrelay")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	amqpURL := testenv.RequireAMQP(t)
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{Settings: map[string]string{"max_slot_wal_keep_size": "1GB"}})

	runWith := func(t *testing.T, f *fixture, extra map[string]string, args ...string) (code int, stdout, stderr string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, config.Prefix) {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		for k, v := range f.vars(extra) {
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
	run := func(t *testing.T, f *fixture, args ...string) (code int, stdout, stderr string) {
		t.Helper()
		return runWith(t, f, nil, args...)
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
	// check is the deploy gate: a typo'd variable, which run ignores with
	// a warning, fails it.
	t.Run("unknown variable", func(t *testing.T) {
		code, stdout, stderr := runWith(t, newFixture(t, pg, amqpURL), map[string]string{"POISSON": "stop"}, "check")
		if code != 1 || !strings.Contains(stdout, "ERROR  configuration") || !strings.Contains(stdout, "CDCRELAY_POISSON (did you mean CDCRELAY_POISON?)") ||
			!strings.Contains(stderr, "cdcrelay: check: 1 error(s)") {
			t.Fatalf("exit %d, want 1 with a configuration error naming CDCRELAY_POISSON, its only error", code)
		}
	})
	t.Run("every configuration problem at once", func(t *testing.T) {
		code, _, stderr := runWith(t, newFixture(t, pg, amqpURL), map[string]string{"POISON": "ignore", "HTTP_ADDR": "8080", "MAX_IN_FLIGHT": "lots"}, "check")
		for _, want := range []string{"\nCDCRELAY_HTTP_ADDR: ", "\nCDCRELAY_MAX_IN_FLIGHT: ", "\nCDCRELAY_POISON: "} {
			if code != 1 || !strings.Contains(stderr, want) {
				t.Errorf("exit %d, want 1 with a line starting %q", code, strings.TrimPrefix(want, "\n"))
			}
		}
	})
	t.Run("usage", func(t *testing.T) {
		code, _, stderr := run(t, newFixture(t, pg, amqpURL))
		if code != 2 || !strings.Contains(stderr, "\n  check ") {
			t.Fatalf("exit %d, usage without check", code)
		}
	})
}
