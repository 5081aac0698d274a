package config

import (
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestRedact: every form in which pgx (or amqp091-go) accepts a password,
// and strings whose split is ambiguous, redacted to their allow-listed
// parts; the password appears in no output, and Secrets finds it.
func TestRedact(t *testing.T) {
	cases := []struct {
		name, in, want string
		secrets        []string // must not appear in the output; Secrets must return them
		hidden         []string // must not appear in the output (not passwords)
	}{
		{"url userinfo", "postgres://u:hunter2@db:5432/app?sslmode=disable",
			"postgres://u:xxxxx@db:5432/app?sslmode=disable", []string{"hunter2"}, nil},
		{"amqp userinfo", "amqp://guest:hunter2@mq:5672/", "amqp://guest:xxxxx@mq:5672/", []string{"hunter2"}, nil},
		{"key=value", "host=db port=5432 user=u password=hunter2 dbname=app",
			"host=db port=5432 user=u password=xxxxx dbname=app", []string{"hunter2"}, nil},
		{"url ?password=", "postgres://relay@db:5432/app?password=S3cr3tQ&sslmode=require",
			"postgres://relay@db:5432/app?password=xxxxx&sslmode=require", []string{"S3cr3tQ"}, nil},
		{"url ?sslpassword=", "postgres://relay@db/app?sslpassword=K3yPass&sslmode=verify-full&sslkey=/etc/k.pem",
			"postgres://relay@db/app?sslpassword=xxxxx&sslmode=verify-full&sslkey=/etc/k.pem", []string{"K3yPass"}, nil},
		{"url both and userinfo", "postgresql://relay:U1-pw@db/app?password=Q1-pw&sslpassword=S1-pw",
			"postgresql://relay:xxxxx@db/app?password=xxxxx&sslpassword=xxxxx", []string{"U1-pw", "Q1-pw", "S1-pw"}, nil},
		{"multi-host url", "postgresql://u:Mh0st-pw@h1:5432,h2:5433,[::1]/app?target_session_attrs=read-write",
			"postgresql://u:xxxxx@h1:5432,h2:5433,[::1]/app?target_session_attrs=read-write", []string{"Mh0st-pw"}, nil},
		{"percent-encoded userinfo password", "postgres://u:p%40ss%2Fw%3Ard@db/app",
			"postgres://u:xxxxx@db/app", []string{"p@ss/w:rd", "p%40ss%2Fw%3Ard"}, nil},
		{"percent-encoded query password", "postgres://u@db/app?password=Enc%2B%26pw",
			"postgres://u@db/app?password=xxxxx", []string{"Enc+&pw", "Enc%2B%26pw"}, nil},
		{"percent-encoded parameter name", "postgres://u@db/app?pass%77ord=Enc0ded&ssl%70assword=Enc1ded",
			"postgres://u@db/app?password=xxxxx&sslpassword=xxxxx", []string{"Enc0ded", "Enc1ded"}, nil},
		{"password with '?' and '#' in userinfo", "postgres://u:pa?s#s@db/app",
			"postgres://u:xxxxx@db/app", []string{"pa?s#s"}, nil},
		{"key=value sslpassword, quoted password", `host=db user=u password='a b\'c' sslpassword=KvSsl-pw dbname=app sslmode=require`,
			"host=db user=u password=xxxxx sslpassword=xxxxx dbname=app sslmode=require", []string{`a b'c`, "KvSsl-pw"}, nil},
		{"key=value spaced", "host = db password = Sp4ce-pw", "host=db password=xxxxx", []string{"Sp4ce-pw"}, nil},
		{"key=value multi-host", "host=h1,h2 port=5432,5433 user=u password=KvMh-pw target_session_attrs=primary",
			"host=h1,h2 port=5432,5433 user=u password=xxxxx target_session_attrs=primary", []string{"KvMh-pw"}, nil},
		{"unknown parameters hidden", "postgres://u@db/app?options=-c%20search_path%3Dsecret1&application_name=relay&my%20key=secret2",
			"postgres://u@db/app?options=xxxxx&application_name=relay", nil, []string{"secret1", "secret2", "my"}},
		{"amqp query parameters", "amqps://u:Mq-pw@mq:5671/vh?heartbeat=10&password=Q-pw&certfile=/c.pem",
			"amqps://u:xxxxx@mq:5671/vh?heartbeat=10&password=xxxxx&certfile=/c.pem", []string{"Mq-pw", "Q-pw"}, nil},
		{"other scheme", "http://guest:Mq-S3cret@x/", "http://guest:xxxxx@x/", []string{"Mq-S3cret"}, nil},
		{"amqp fragment: ambiguous", "amqp://u:12#pw@h/", unparseable, []string{"12#pw"}, nil},
		{"amqp unescaped '@': ambiguous", "amqp://u:p@ss@h/", unparseable, []string{"p@ss"}, nil},
		{"postgres '@' in the hosts: ambiguous", "postgres://u:p@ss@h/db", unparseable, []string{"ss@h"}, nil},
		{"postgres '@' in a query value: ambiguous", "postgres://h?password=p@ss", unparseable, []string{"p@ss"}, nil},
		{"not a connection string", "nonsense", unparseable, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Redact(c.in)
			if got != c.want {
				t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
			}
			found := Secrets(c.in)
			for _, s := range c.hidden {
				if strings.Contains(got, s) {
					t.Errorf("Redact(%q) = %q shows %q", c.in, got, s)
				}
			}
			for _, s := range c.secrets {
				if strings.Contains(got, s) {
					t.Errorf("Redact(%q) = %q shows %q", c.in, got, s)
				}
				if c.want != unparseable && !slices.Contains(found, s) {
					t.Errorf("Secrets(%q) = %q, missing %q", c.in, found, s)
				}
			}
		})
	}
}

// FuzzRedact: no input panics Redact, and whatever password pgx reads from
// a connection string, or amqp091-go from any node of an AMQP URL (that
// the string holds only once, so that it is not also a host or a database
// name) is not in its redacted form; for AMQP, Scrub hides it too.
func FuzzRedact(f *testing.F) {
	for _, s := range []string{
		"postgres://u:pw-1234@db/app?sslmode=require",
		"postgres://u@db/app?password=pw-1234",
		"postgresql://u:p%40ss-1234@h1,h2:5433/app",
		"host=db user=u password='pw 1234' dbname=app",
		"postgres://u:12#pw@h/db",
		"postgres://h?password=p@ss-1234",
		"amqp://guest:pw-1234@mq:5672/vh?heartbeat=10",
		"amqp://guest:pw-1234@h1:5672,h2:5673,h3/vh",
		"amqps://u:p%40ss-1234@[::1]:5671,[fe80::1%25eth0],10.0.0.3/%2f?heartbeat=5",
		"amqp://u:pw/1234@h1,h2/",
		"amqp://u:pw@1234@h1,h2:5672/",
		"amqp://u:pw-1234@h1,,h3/",
		"amqp://h1,h2?password=pw-1234",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dsn string) {
		checkAMQPRedaction(t, dsn) // one broker node or several
		got := Redact(dsn)
		cfg, err := pgconn.ParseConfig(dsn)
		if err != nil {
			return
		}
		pw := cfg.Password
		if len(pw) < 4 || strings.Count(dsn, pw) > 1 || strings.Contains(redacted, pw) {
			return
		}
		if strings.Contains(got, pw) {
			t.Fatalf("Redact(%q) = %q shows the password %q", dsn, got, pw)
		}
	})
}
