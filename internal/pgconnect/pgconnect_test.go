package pgconnect

import (
	"strings"
	"testing"
)

// TestConfigDefaults: application_name and the given parameters are set
// unless the URL sets them; the URL wins.
func TestConfigDefaults(t *testing.T) {
	params := map[string]string{"statement_timeout": "0", "tcp_keepalives_idle": "10"}
	cases := []struct {
		url, app, timeout string
	}{
		{"postgres://u@db/app", ApplicationName, "0"},
		{"postgres://u@db/app?application_name=mine&statement_timeout=5s", "mine", "5s"},
	}
	for _, c := range cases {
		cfg, err := Config(c.url, params)
		if err != nil {
			t.Fatal(err)
		}
		repl, err := ReplicationConfig(c.url, params)
		if err != nil {
			t.Fatal(err)
		}
		for _, rt := range []map[string]string{cfg.RuntimeParams, repl.RuntimeParams} {
			if rt["application_name"] != c.app || rt["statement_timeout"] != c.timeout || rt["tcp_keepalives_idle"] != "10" {
				t.Errorf("%s: runtime params %v", c.url, rt)
			}
		}
	}
}

// TestConfigClientEncoding: every connection talks UTF-8, even when the URL
// asks for another encoding, so both paths read the same bytes in any
// database encoding (docs/messages.md, "Encodings").
func TestConfigClientEncoding(t *testing.T) {
	for _, url := range []string{"postgres://u@db/app", "postgres://u@db/app?client_encoding=LATIN1"} {
		cfg, err := Config(url, nil)
		if err != nil {
			t.Fatal(err)
		}
		repl, err := ReplicationConfig(url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.RuntimeParams["client_encoding"] != "UTF8" || repl.RuntimeParams["client_encoding"] != "UTF8" {
			t.Errorf("%s: client_encoding %q, replication %q", url, cfg.RuntimeParams["client_encoding"], repl.RuntimeParams["client_encoding"])
		}
	}
}

// TestConfigHidesTheURL: a malformed URL is reported without quoting it,
// since it may hold a password.
func TestConfigHidesTheURL(t *testing.T) {
	const bad = "postgres://u:sekret@db:notaport/app"
	_, err := Config(bad, nil)
	_, rerr := ReplicationConfig(bad, nil)
	for _, e := range []error{err, rerr} {
		if e == nil || strings.Contains(e.Error(), "sekret") {
			t.Fatalf("error %v", e)
		}
	}
}
