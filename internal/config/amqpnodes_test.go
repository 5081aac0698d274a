package config

import (
	"slices"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestParseAMQPURL: one node or a libpq-style list, each node an ordinary
// URL amqp091-go dials, with the scheme's port when the list names none.
func TestParseAMQPURL(t *testing.T) {
	for _, c := range []struct {
		in    string
		want  []string
		addrs []string
	}{
		{"amqp://u:pw@mq:5672/", []string{"amqp://u:pw@mq:5672/"}, []string{"mq:5672"}},
		{"amqp://mq", []string{"amqp://mq"}, []string{"mq:5672"}},
		{"amqps://u:pw@mq/vh", []string{"amqps://u:pw@mq/vh"}, []string{"mq:5671"}},
		{"amqp://u:pw@h1:5672,h2:5673,h3:5674/vh",
			[]string{"amqp://u:pw@h1:5672/vh", "amqp://u:pw@h2:5673/vh", "amqp://u:pw@h3:5674/vh"},
			[]string{"h1:5672", "h2:5673", "h3:5674"}},
		{"amqp://u:pw@h1,h2:5673,h3/vh",
			[]string{"amqp://u:pw@h1:5672/vh", "amqp://u:pw@h2:5673/vh", "amqp://u:pw@h3:5672/vh"},
			[]string{"h1:5672", "h2:5673", "h3:5672"}},
		{"amqps://u:pw@h1,h2/vh?heartbeat=10",
			[]string{"amqps://u:pw@h1:5671/vh?heartbeat=10", "amqps://u:pw@h2:5671/vh?heartbeat=10"},
			[]string{"h1:5671", "h2:5671"}},
		{"amqp://h1,h2?heartbeat=5", []string{"amqp://h1:5672?heartbeat=5", "amqp://h2:5672?heartbeat=5"},
			[]string{"h1:5672", "h2:5672"}},
		{"amqp://u:p%40ss%2C@[::1]:5672,[fe80::1%25eth0],10.0.0.3:5673/%2f",
			[]string{"amqp://u:p%40ss%2C@[::1]:5672/%2f", "amqp://u:p%40ss%2C@[fe80::1%25eth0]:5672/%2f", "amqp://u:p%40ss%2C@10.0.0.3:5673/%2f"},
			[]string{"[::1]:5672", "[fe80::1%eth0]:5672", "10.0.0.3:5673"}},
		{"AMQP://u:pw@h1,h2/", []string{"amqp://u:pw@h1:5672/", "amqp://u:pw@h2:5672/"}, []string{"h1:5672", "h2:5672"}},
		{"amqp://u:pw@h1:,h2/", []string{"amqp://u:pw@h1:5672/", "amqp://u:pw@h2:5672/"}, []string{"h1:5672", "h2:5672"}},
	} {
		got, err := ParseAMQPURL(c.in)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("ParseAMQPURL(%q) = %q, %v; want %q", c.in, got, err, c.want)
			continue
		}
		var addrs []string
		for _, n := range got {
			addrs = append(addrs, AMQPNodeAddr(n))
		}
		if !slices.Equal(addrs, c.addrs) {
			t.Errorf("AMQPNodeAddr of %q = %q, want %q", got, addrs, c.addrs)
		}
	}
}

// TestParseAMQPURLErrors: each malformed URL gets a message saying what is
// wrong, naming the variable through Load, and never a piece of the
// password (which a misplaced '/' or '@' moves into the hosts or the port).
func TestParseAMQPURLErrors(t *testing.T) {
	const pw = "Pw-s3cret"
	for _, c := range []struct{ in, want string }{
		{"http://u:" + pw + "@mq/", "scheme must be amqp:// or amqps://"},
		{"mq:5672", "want amqp://"},
		{"amqp://u:" + pw + "@/", "the host: empty"},
		{"amqp://u:" + pw + "@h1,,h3/", "host 2 of 3: empty"},
		{"amqp://u:" + pw + "@h1,h2,/", "host 3 of 3: empty"},
		{"amqp://u:" + pw + "@h1:99999,h2/", "host 1 of 2: the port is outside 1..65535"},
		{"amqp://u:" + pw + "@h1,h2:0/", "host 2 of 2: the port is outside 1..65535"},
		{"amqp://u:" + pw + "@h1,h2:port/", "host 2 of 2: not a host name"},
		{"amqp://u:" + pw + "@[::1/", "not a host name"},
		{"amqp://u:" + pw + "@::1,h2/", "host 1 of 2: not a host name"},
		{"amqp://u:ab/" + pw + "@h1,h2/", "not a host name"},   // an unescaped '/' in the password
		{"amqp://u:ab@" + pw + "@h1,h2/", "more than one '@'"}, // an unescaped '@'
		{"amqp://u:" + pw + "#x@h1,h2/", "'#'"},
		{"amqp://u:" + pw + "@h1, h2/", "white space"},
	} {
		_, err := ParseAMQPURL(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseAMQPURL(%q) = %v, want an error with %q", c.in, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), pw) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseAMQPURL(%q): error shows the password: %v", c.in, err)
		}
		_, lerr := load(t, map[string]string{"DATABASE_URL": "postgres://u@db/app", "AMQP_URL": c.in})
		if lerr == nil || !strings.HasPrefix(lerr.Error(), "CDCRELAY_AMQP_URL: ") || strings.Contains(lerr.Error(), "s3cret") {
			t.Errorf("Load with %q: %v; want one line naming CDCRELAY_AMQP_URL, without the password", c.in, lerr)
		}
	}
}

// TestAMQPNodesFromLoad: the loaded configuration hands out the nodes, and
// TLS files still require amqps:// for a list.
func TestAMQPNodesFromLoad(t *testing.T) {
	c, err := load(t, map[string]string{"DATABASE_URL": "postgres://u@db/app", "AMQP_URL": "amqp://u:pw@r1:5672,r2:5673/"})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.AMQPNodes(); !slices.Equal(got, []string{"amqp://u:pw@r1:5672/", "amqp://u:pw@r2:5673/"}) {
		t.Fatalf("AMQPNodes() = %q", got)
	}
	if got := (&Config{}).AMQPNodes(); got != nil {
		t.Fatalf("AMQPNodes() of no URL = %q, want nil", got)
	}
	_, err = load(t, map[string]string{"DATABASE_URL": "postgres://u@db/app", "AMQP_URL": "amqp://u:pw@r1,r2/", "AMQP_TLS_CA": "/nonexistent/ca.pem"})
	if err == nil || !strings.Contains(err.Error(), "CDCRELAY_AMQP_URL: TLS files are set but the URL is not amqps://") {
		t.Fatalf("TLS files with amqp:// and two nodes: %v", err)
	}
}

// TestRedactAMQPNodes: a list of nodes is shown whole, the password of
// none of them; the configuration's Scrub hides the list and each node's
// own URL, as a library that dialed one node would quote it.
func TestRedactAMQPNodes(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"amqp://relay:Nodes-pw1@h1:5672,h2:5673,h3/vh?heartbeat=10&password=Q-pw1",
			"amqp://relay:xxxxx@h1:5672,h2:5673,h3/vh?heartbeat=10&password=xxxxx"},
		{"amqps://relay:Nodes-pw1@[::1]:5671,[fe80::1%25eth0]/", "amqps://relay:xxxxx@[::1]:5671,[fe80::1%25eth0]/"},
		{"amqp://relay:Nodes-pw1@h1,h2", "amqp://relay:xxxxx@h1,h2"},
		// An unescaped '/' or '@' in the password: the split is not certain.
		{"amqp://relay:No/des-pw1@h1,h2/", unparseable},
		{"amqp://relay:No@des-pw1@h1,h2/", unparseable},
		{"amqp://relay:Nodes-pw1@h1,h 2/", unparseable},
	} {
		got := Redact(c.in)
		if got != c.want {
			t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
		}
		for _, pw := range []string{"Nodes-pw1", "des-pw1", "Q-pw1"} {
			if strings.Contains(got, pw) {
				t.Errorf("Redact(%q) = %q shows %q", c.in, got, pw)
			}
		}
	}
	cfg := Config{AMQPURL: "amqp://relay:Nodes-pw1@h1:5672,h2:5673/vh"}
	text := "connect to " + cfg.AMQPURL + " failed; dial amqp://relay:Nodes-pw1@h2:5673/vh: refused (password Nodes-pw1)"
	got := cfg.Scrub(text)
	if strings.Contains(got, "Nodes-pw1") {
		t.Fatalf("Scrub left the password: %s", got)
	}
	for _, want := range []string{"amqp://relay:xxxxx@h1:5672,h2:5673/vh", "amqp://relay:xxxxx@h2:5673/vh"} {
		if !strings.Contains(got, want) {
			t.Errorf("Scrub(%q) = %q, want it to show %q", text, got, want)
		}
	}
}

// checkAMQPRedaction fails t if the password amqp091-go reads from any node
// of dsn shows in Redact(dsn) or survives the configuration's Scrub of the
// URL, of the node's URL or of the bare password. A password found more
// than once in dsn (it is also a host, say) or short enough to be a piece
// of "xxxxx" is not judged.
func checkAMQPRedaction(t *testing.T, dsn string) {
	nodes, err := ParseAMQPURL(dsn)
	if err != nil {
		return
	}
	if parts, _ := splitAMQPURL(dsn); !strings.Contains(parts.userinfo, ":") {
		return // amqp091-go's default password (guest), not one of dsn's
	}
	got := Redact(dsn)
	cfg := Config{AMQPURL: dsn}
	for _, node := range nodes {
		u, err := amqp.ParseURI(node)
		if err != nil {
			t.Fatalf("node %q of %q does not parse: %v", node, dsn, err)
		}
		pw := u.Password
		if len(pw) < minScrubLen || strings.Count(dsn, pw) != 1 || strings.Contains(redacted, pw) {
			continue
		}
		if strings.Contains(got, pw) {
			t.Fatalf("Redact(%q) = %q shows the password %q", dsn, got, pw)
		}
		for _, text := range []string{dsn, node, "password " + pw} {
			if s := cfg.Scrub(text); strings.Contains(s, pw) {
				t.Fatalf("Scrub(%q) with CDCRELAY_AMQP_URL=%q = %q shows the password %q", text, dsn, s, pw)
			}
		}
	}
}
