package config

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"
)

func load(t *testing.T, env map[string]string) (Config, error) {
	t.Helper()
	m := map[string]string{}
	for k, v := range env {
		m[Prefix+k] = v
	}
	return LoadFrom(context.Background(), envconfig.MapLookuper(m))
}

func TestDefaults(t *testing.T) {
	c, err := load(t, map[string]string{"DATABASE_URL": "postgres://u:pw@db/app", "AMQP_URL": "amqp://u:pw@mq:5672/"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Exchange != "events" || c.Table != "public.event_outbox" || c.Publication != "cdcrelay_outbox" ||
		c.Slot != "cdcrelay_outbox" || c.HTTPAddr != ":8080" || c.MaxInFlight != 1000 ||
		c.MaxInFlightBytes != 16<<20 || c.ConfirmTimeout != 30*time.Second || c.StatusInterval != 10*time.Second ||
		time.Duration(c.Retention) != 7*24*time.Hour || time.Duration(c.RetentionInterval) != time.Hour || c.SlotLost != SlotLostRecreate {
		t.Fatalf("defaults %+v", c)
	}
}

func TestEveryBadValueNamed(t *testing.T) {
	_, err := load(t, map[string]string{
		"DATABASE_URL":        "postgres://u:hunter2@db/app",
		"AMQP_URL":            "http://u:hunter2@mq/",
		"MAX_IN_FLIGHT":       "lots",
		"CONFIRM_TIMEOUT":     "soon",
		"MAX_IN_FLIGHT_BYTES": "16 megs",
	})
	if err == nil {
		t.Fatal("no error")
	}
	lines := strings.Split(err.Error(), "\n")
	for _, want := range []string{"CDCRELAY_MAX_IN_FLIGHT:", "CDCRELAY_CONFIRM_TIMEOUT:", "CDCRELAY_MAX_IN_FLIGHT_BYTES:"} {
		found := false
		for _, l := range lines {
			found = found || strings.HasPrefix(l, want)
		}
		if !found {
			t.Errorf("no line starting %q in:\n%s", want, err)
		}
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error leaks a password:\n%s", err)
	}

	_, err = load(t, map[string]string{
		"DATABASE_URL": "postgres://u:hunter2@db/app", "AMQP_URL": "http://u:hunter2@mq/",
		"SLOT": "Bad-Slot", "TABLE": "a.b.c", "MAX_IN_FLIGHT": "0", "BACKOFF_MIN": "1m", "BACKOFF_MAX": "1s", "LOG_FORMAT": "xml",
	})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"CDCRELAY_AMQP_URL:", "CDCRELAY_SLOT:", "CDCRELAY_TABLE:", "CDCRELAY_MAX_IN_FLIGHT:", "CDCRELAY_BACKOFF_MAX:", "CDCRELAY_LOG_FORMAT:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%s", want, err)
		}
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error leaks a password:\n%s", err)
	}
}

func TestRequired(t *testing.T) {
	_, err := load(t, nil)
	if err == nil || !strings.Contains(err.Error(), "CDCRELAY_DATABASE_URL: required") {
		t.Fatalf("error %v", err)
	}
	c, err := load(t, map[string]string{"DATABASE_URL": "postgres://db/app"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.RequireBroker(); err == nil || !strings.Contains(err.Error(), "CDCRELAY_AMQP_URL") {
		t.Fatalf("RequireBroker: %v", err)
	}
}

func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "db")
	if err := os.WriteFile(db, []byte("postgres://u:pw@db/app\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := load(t, map[string]string{"DATABASE_URL_FILE": db, "AMQP_URL": "amqp://mq/"})
	if err != nil {
		t.Fatal(err)
	}
	if c.DatabaseURL != "postgres://u:pw@db/app" {
		t.Fatalf("url %q", c.DatabaseURL)
	}
	if _, err := load(t, map[string]string{"DATABASE_URL_FILE": db, "DATABASE_URL": "postgres://x/y", "AMQP_URL": "amqp://mq/"}); err == nil {
		t.Fatal("both URL and file accepted")
	}
	if _, err := load(t, map[string]string{"DATABASE_URL_FILE": filepath.Join(dir, "missing"), "AMQP_URL": "amqp://mq/"}); err == nil ||
		!strings.Contains(err.Error(), "CDCRELAY_DATABASE_URL_FILE") {
		t.Fatalf("missing file: %v", err)
	}
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]ByteSize{"1024": 1024, "512KiB": 512 << 10, "16MiB": 16 << 20, "1GiB": 1 << 30, "10B": 10} {
		var b ByteSize
		if err := b.EnvDecode(in); err != nil || b != want {
			t.Errorf("%q: %d, %v; want %d", in, b, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "1.5MiB", "16MB", "MiB"} {
		var b ByteSize
		if err := b.EnvDecode(in); err == nil {
			t.Errorf("%q accepted as %d", in, b)
		}
	}
}

func TestDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"7d": 7 * 24 * time.Hour, "1d12h": 36 * time.Hour, "90m": 90 * time.Minute, "0d": 0} {
		var d Duration
		if err := d.EnvDecode(in); err != nil || time.Duration(d) != want {
			t.Errorf("%q: %v, %v; want %v", in, time.Duration(d), err, want)
		}
	}
	for _, in := range []string{"", "d", "7 days", "-1d", "1.5d", "7dd"} {
		var d Duration
		if err := d.EnvDecode(in); err == nil && in != "" {
			t.Errorf("%q accepted as %v", in, time.Duration(d))
		}
	}
}

// FuzzLoad: no input may panic the loader or leak the password into an error.
func FuzzLoad(f *testing.F) {
	f.Add("1000", "30s", "16MiB", "public.event_outbox")
	f.Add("x", "-1s", "1GiB", "a.b.c")
	f.Add("1", `"Id"`, "1KiB", `"Billing"."Outbox Events"`)
	f.Fuzz(func(t *testing.T, inflight, timeout, size, table string) {
		_, err := LoadFrom(context.Background(), envconfig.MapLookuper(map[string]string{
			Prefix + "DATABASE_URL": "postgres://u:s3cr3tpw@db/app", Prefix + "AMQP_URL": "amqp://u:s3cr3tpw@mq/",
			Prefix + "MAX_IN_FLIGHT": inflight, Prefix + "CONFIRM_TIMEOUT": timeout,
			Prefix + "MAX_IN_FLIGHT_BYTES": size, Prefix + "TABLE": table,
			Prefix + "PUBLICATION": table, Prefix + "ID_COLUMN": timeout,
		}))
		if err != nil && strings.Contains(err.Error(), "s3cr3tpw") {
			t.Fatalf("password in error: %v", err)
		}
	})
}

// TestAllProblemsAtOnce: decode errors, unreadable files and values that
// decode but make no sense come back together, one line per variable, each
// line naming its variable once.
func TestAllProblemsAtOnce(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent")
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string // line prefixes, in this order
	}{
		{"decode and validate together", map[string]string{
			"DATABASE_URL": "postgres://u@db/app", "MAX_IN_FLIGHT": "lots", "POISON": "ignore", "HTTP_ADDR": "8080",
		}, []string{"CDCRELAY_HTTP_ADDR:", "CDCRELAY_MAX_IN_FLIGHT:", "CDCRELAY_POISON:"}},
		{"file, decode and validate together", map[string]string{
			"DATABASE_URL_FILE": missing, "RETENTION": "a week", "SLOT": "Bad-Slot", "LOG_FORMAT": "xml",
		}, []string{"CDCRELAY_DATABASE_URL_FILE:", "CDCRELAY_SLOT:", "CDCRELAY_RETENTION:", "CDCRELAY_LOG_FORMAT:"}},
		{"a value that does not decode is not also out of range", map[string]string{
			"DATABASE_URL": "postgres://u@db/app", "CONFIRM_TIMEOUT": "-", "BACKOFF_MIN": "soon", "MARK_BATCH": "0",
		}, []string{"CDCRELAY_CONFIRM_TIMEOUT:", "CDCRELAY_BACKOFF_MIN:", "CDCRELAY_MARK_BATCH:"}},
		{"both URL and file", map[string]string{
			"DATABASE_URL": "postgres://u@db/app", "DATABASE_URL_FILE": missing, "AMQP_URL": "http://mq/",
		}, []string{"CDCRELAY_DATABASE_URL and CDCRELAY_DATABASE_URL_FILE are both set", "CDCRELAY_AMQP_URL:"}},
		{"a standby-held slot cannot be a failover slot", map[string]string{
			"DATABASE_URL": "postgres://u@db/app", "REPLICATION_URL": "postgres://u@standby/app", "SLOT_FAILOVER": "on", "MARK_ORIGIN": "on",
		}, []string{"CDCRELAY_SLOT_FAILOVER: on with CDCRELAY_REPLICATION_URL", "CDCRELAY_MARK_ORIGIN:"}},
		{"replication URL and file, a bad failover value", map[string]string{
			"DATABASE_URL": "postgres://u@db/app", "REPLICATION_URL": "postgres://u@standby/app", "REPLICATION_URL_FILE": missing, "SLOT_FAILOVER": "yes",
		}, []string{"CDCRELAY_REPLICATION_URL and CDCRELAY_REPLICATION_URL_FILE are both set", "CDCRELAY_SLOT_FAILOVER:"}},
		{"missing URL with a bad value", map[string]string{"PUBLISH_CHANNELS": "100"},
			[]string{"CDCRELAY_DATABASE_URL: required", "CDCRELAY_PUBLISH_CHANNELS:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.env)
			if err == nil {
				t.Fatal("no error")
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tc.want) {
				t.Fatalf("%d lines, want %d:\n%s", len(lines), len(tc.want), err)
			}
			for i, want := range tc.want {
				if !strings.HasPrefix(lines[i], want) {
					t.Errorf("line %d = %q, want it to start with %q", i+1, lines[i], want)
				}
			}
		})
	}
}
