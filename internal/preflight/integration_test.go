package preflight_test

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sethvargo/go-envconfig"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/preflight"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
	"github.com/cdcrelay/cdcrelay/migrations"
)

// rolePassword is put in every URL the checks get; trust authentication
// ignores it, and no output may contain it.
const rolePassword = "Preflight-Secret-7f3a"

// fixture is one database of a throwaway cluster with the outbox schema
// applied by its owner (postgres), as `cdcrelay migrate` would, and a
// least-privilege relay role as docs/least-privilege.md describes.
type fixture struct {
	t        *testing.T
	pg       *testenv.Postgres
	database string
	role     string
	amqpURL  string
	exchange string
	admin    *pgx.Conn // superuser, on the fixture's database
}

// newFixture creates the database, the schema, the role and a declared
// exchange. setup (run as the superuser after the migrations) breaks
// whatever the test is about.
func newFixture(t *testing.T, pg *testenv.Postgres, amqpURL string, setup ...string) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{t: t, pg: pg, database: testenv.UniqueName("app"), role: testenv.UniqueName("relay"),
		amqpURL: amqpURL, exchange: testenv.UniqueName("cdcrelay.preflight")}
	if err := pg.CreateDatabase(ctx, f.database); err != nil {
		t.Fatal(err)
	}
	f.admin = connect(t, pg.URL(f.database))
	if err := migrations.Apply(ctx, f.admin); err != nil {
		t.Fatal(err)
	}
	f.exec(
		`CREATE ROLE `+f.role+` LOGIN REPLICATION PASSWORD '`+rolePassword+`'`,
		`GRANT SELECT, DELETE ON event_outbox TO `+f.role,
		`GRANT UPDATE (published_at, attempts, last_error) ON event_outbox TO `+f.role,
	)
	f.exec(setup...)
	if err := testenv.DeclareExchange(ctx, amqpURL, f.exchange); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = testenv.DeleteExchange(cctx, amqpURL, f.exchange)
	})
	return f
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	return relaytest.Connect(t, dsn)
}

// exec runs statements as the superuser; "{role}" stands for the relay role.
func (f *fixture) exec(sqls ...string) {
	f.t.Helper()
	for _, sql := range sqls {
		if _, err := f.admin.Exec(context.Background(), strings.ReplaceAll(sql, "{role}", f.role)); err != nil {
			f.t.Fatalf("%s: %v", sql, err)
		}
	}
}

// url is the database URL for the relay role, password included.
func (f *fixture) url() string {
	u, err := url.Parse(f.pg.URL(f.database))
	if err != nil {
		f.t.Fatal(err)
	}
	u.User = url.UserPassword(f.role, rolePassword)
	return u.String()
}

// vars is the relay's environment, without the prefix.
func (f *fixture) vars(extra map[string]string) map[string]string {
	v := map[string]string{"DATABASE_URL": f.url(), "AMQP_URL": f.amqpURL, "EXCHANGE": f.exchange}
	for k, val := range extra {
		v[k] = val
	}
	return v
}

// check runs the preflight as `cdcrelay check` would and returns the
// findings and the printed report.
func (f *fixture) check(extra map[string]string) ([]preflight.Finding, string) {
	f.t.Helper()
	return runChecks(f.t, f.vars(extra))
}

func runChecks(t *testing.T, vars map[string]string) ([]preflight.Finding, string) {
	t.Helper()
	env := map[string]string{}
	for k, v := range vars {
		env[config.Prefix+k] = v
	}
	cfg, err := config.LoadFrom(context.Background(), envconfig.MapLookuper(env))
	if err != nil {
		t.Fatal(err)
	}
	fs := preflight.Run(context.Background(), cfg, preflight.Options{Timeout: 10 * time.Second})
	var b bytes.Buffer
	preflight.Write(&b, fs)
	out := b.String()
	t.Logf("cdcrelay check:\n%s", out)
	if strings.Contains(out, rolePassword) {
		t.Fatalf("the report contains the password")
	}
	remediesParse(t, fs)
	return fs, out
}

// want asserts exactly the given Error findings (check and message
// fragment), and every one with a remedy.
func want(t *testing.T, fs []preflight.Finding, errs ...[2]string) {
	t.Helper()
	var got []preflight.Finding
	for _, f := range fs {
		if f.Severity == preflight.Error {
			got = append(got, f)
			if f.Remedy == "" {
				t.Errorf("error without a remedy: %+v", f)
			}
		}
	}
	if len(got) != len(errs) {
		t.Fatalf("%d errors, want %d: %v", len(got), len(errs), errs)
	}
	for i, e := range errs {
		if got[i].Check != e[0] || !strings.Contains(got[i].Message, e[1]) {
			t.Errorf("error %d: %s: %q; want %s: …%s…", i, got[i].Check, got[i].Message, e[0], e[1])
		}
	}
}

// has asserts a finding of that check and severity whose message (or,
// with remedy:, remedy) contains the fragment.
func has(t *testing.T, fs []preflight.Finding, check string, sev preflight.Severity, fragment string) preflight.Finding {
	t.Helper()
	frag, inRemedy := strings.CutPrefix(fragment, "remedy:")
	for _, f := range fs {
		text := f.Message
		if inRemedy {
			text = f.Remedy
		}
		if f.Check == check && f.Severity == sev && strings.Contains(text, frag) {
			return f
		}
	}
	t.Fatalf("no %v %s finding with %q", sev, check, fragment)
	return preflight.Finding{}
}

func warnings(fs []preflight.Finding) []preflight.Finding {
	var out []preflight.Finding
	for _, f := range fs {
		if f.Severity == preflight.Warn {
			out = append(out, f)
		}
	}
	return out
}

// TestIntegrationCheckRealCluster runs each misconfiguration on a database of its own
// in one cluster (wal_level=logical, max_slot_wal_keep_size set, so a good
// database has no warning either).
func TestIntegrationCheckRealCluster(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{Settings: map[string]string{"max_slot_wal_keep_size": "1GB"}})

	t.Run("good", func(t *testing.T) {
		t.Parallel()
		fs, _ := newFixture(t, pg, amqpURL).check(nil)
		want(t, fs)
		if w := warnings(fs); len(w) != 0 {
			t.Fatalf("warnings on a good database: %+v", w)
		}
		has(t, fs, "wal_level", preflight.OK, "logical")
		has(t, fs, "privileges", preflight.OK, "has REPLICATION, SELECT, UPDATE (published_at), DELETE on public.event_outbox")
		has(t, fs, "replication connection", preflight.OK, "works")
		has(t, fs, "publication", preflight.OK, "cdcrelay_outbox publishes inserts only, of public.event_outbox")
		has(t, fs, "slot", preflight.OK, "does not exist yet: the relay creates it")
		has(t, fs, "max_slot_wal_keep_size", preflight.OK, "1024MB")
		has(t, fs, "exchange", preflight.OK, "exists")
	})

	t.Run("missing publication", func(t *testing.T) {
		t.Parallel()
		fs, _ := newFixture(t, pg, amqpURL, `DROP PUBLICATION cdcrelay_outbox`).check(nil)
		want(t, fs, [2]string{"publication", "publication cdcrelay_outbox does not exist; role"})
		has(t, fs, "publication", preflight.Error, "remedy:run `cdcrelay migrate` as the owner of public.event_outbox, or: CREATE PUBLICATION cdcrelay_outbox FOR TABLE public.event_outbox WITH (publish = 'insert');")
		has(t, fs, "slot", preflight.OK, "needs the publication first")
	})

	t.Run("publication with updates", func(t *testing.T) {
		t.Parallel()
		fs, _ := newFixture(t, pg, amqpURL,
			`DROP PUBLICATION cdcrelay_outbox`,
			`CREATE PUBLICATION cdcrelay_outbox FOR TABLE event_outbox WITH (publish = 'insert,update')`,
		).check(nil)
		want(t, fs)
		has(t, fs, "publication", preflight.Warn, "also publishes update: the relay works, but the walsender decodes every such change")
		has(t, fs, "publication", preflight.Warn, "remedy:ALTER PUBLICATION cdcrelay_outbox SET (publish = 'insert');")
	})

	t.Run("publication of every operation", func(t *testing.T) {
		t.Parallel()
		// CREATE PUBLICATION's default: insert, update, delete, truncate.
		// run streams it (it skips what is not an insert), so check warns
		// about the cost and does not fail.
		f := newFixture(t, pg, amqpURL,
			`DROP PUBLICATION cdcrelay_outbox`,
			`CREATE PUBLICATION cdcrelay_outbox FOR TABLE event_outbox`,
		)
		fs, _ := f.check(nil)
		want(t, fs)
		has(t, fs, "publication", preflight.Warn, "also publishes update, delete, truncate: the relay works, but the walsender decodes every such change")
		has(t, fs, "publication", preflight.Warn, "remedy:ALTER PUBLICATION cdcrelay_outbox SET (publish = 'insert');")
		// The check run makes at every start agrees.
		ctx := context.Background()
		target := config.Outbox{Publication: "cdcrelay_outbox", Schema: "public", Table: "event_outbox"}
		if _, _, err := slot.VerifyPublication(ctx, f.admin, target); err != nil {
			t.Fatalf("run would refuse the publication check passes: %v", err)
		}
	})

	t.Run("target_session_attrs=read-write", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, pg, amqpURL)
		fs, _ := f.check(map[string]string{"DATABASE_URL": f.url() + "&target_session_attrs=read-write"})
		want(t, fs)
		has(t, fs, "database", preflight.OK, "connected to")
		has(t, fs, "replication connection", preflight.OK, "works")
		has(t, fs, "slot_lock", preflight.OK, "reachable for the slot lock")
	})

	t.Run("publication of other tables too", func(t *testing.T) {
		t.Parallel()
		fs, _ := newFixture(t, pg, amqpURL,
			`CREATE TABLE orders (id int PRIMARY KEY)`,
			`ALTER PUBLICATION cdcrelay_outbox ADD TABLE orders`,
		).check(nil)
		want(t, fs)
		has(t, fs, "publication", preflight.Warn, "also covers public.orders, which is not the outbox: the relay skips its inserts")
		has(t, fs, "publication", preflight.Warn, "remedy:ALTER PUBLICATION cdcrelay_outbox DROP TABLE public.orders;")
	})

	t.Run("publication of a child of the outbox too", func(t *testing.T) {
		t.Parallel()
		// A child table's rows may be outbox rows under another name
		// (the backfill reads them through the parent): refused.
		fs, _ := newFixture(t, pg, amqpURL,
			`CREATE TABLE event_outbox_child () INHERITS (event_outbox)`,
			`ALTER PUBLICATION cdcrelay_outbox ADD TABLE event_outbox_child`,
		).check(nil)
		want(t, fs, [2]string{"publication", "also covers public.event_outbox_child, of the partition or inheritance tree of public.event_outbox"})
	})

	t.Run("partitioned outbox", func(t *testing.T) {
		t.Parallel()
		partitioned := []string{
			`DROP PUBLICATION cdcrelay_outbox`,
			`DROP TABLE event_outbox`,
			`CREATE TABLE event_outbox (id UUID NOT NULL DEFAULT gen_random_uuid(), routing_key TEXT NOT NULL, payload JSONB NOT NULL,
				enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now(), published_at TIMESTAMPTZ, attempts INT NOT NULL DEFAULT 0, last_error TEXT,
				PRIMARY KEY (id, enqueued_at)) PARTITION BY RANGE (enqueued_at)`,
			`CREATE TABLE event_outbox_rest PARTITION OF event_outbox DEFAULT`,
			`GRANT SELECT, DELETE ON event_outbox TO {role}`,
			`GRANT UPDATE (published_at, attempts, last_error) ON event_outbox TO {role}`,
		}
		fs, _ := newFixture(t, pg, amqpURL, append(partitioned,
			`CREATE PUBLICATION cdcrelay_outbox FOR TABLE event_outbox WITH (publish = 'insert')`)...).check(nil)
		want(t, fs, [2]string{"publication", "is partitioned and publication cdcrelay_outbox publishes its rows under each partition's name"})
		fs, _ = newFixture(t, pg, amqpURL, append(partitioned,
			`CREATE PUBLICATION cdcrelay_outbox FOR TABLE event_outbox WITH (publish = 'insert', publish_via_partition_root = true)`)...).check(nil)
		want(t, fs)
	})

	t.Run("publication of another table", func(t *testing.T) {
		t.Parallel()
		fs, _ := newFixture(t, pg, amqpURL,
			`CREATE TABLE orders (id int PRIMARY KEY)`,
			`ALTER PUBLICATION cdcrelay_outbox SET TABLE orders`,
		).check(nil)
		want(t, fs, [2]string{"publication", "does not cover public.event_outbox"})
	})

	t.Run("missing column", func(t *testing.T) {
		t.Parallel()
		fs, _ := newFixture(t, pg, amqpURL, `ALTER TABLE event_outbox RENAME COLUMN payload TO body`).check(nil)
		want(t, fs, [2]string{"mapping", `message body column "payload" (CDCRELAY_PAYLOAD_COLUMN) is not in public.event_outbox`})
	})

	t.Run("column mapping configured", func(t *testing.T) {
		t.Parallel()
		fs, _ := newFixture(t, pg, amqpURL,
			`ALTER TABLE event_outbox RENAME COLUMN payload TO body`,
			`ALTER TABLE event_outbox ADD COLUMN headers jsonb, ADD COLUMN kind text`,
		).check(map[string]string{"PAYLOAD_COLUMN": "body", "TYPE_COLUMN": "kind"})
		want(t, fs)
		has(t, fs, "mapping", preflight.OK, "body: jsonb → message body")
		has(t, fs, "mapping", preflight.OK, "headers: jsonb → AMQP headers")
		has(t, fs, "mapping", preflight.OK, "kind: text → AMQP type")
		has(t, fs, "mapping", preflight.OK, "optional columns not in the table (their features are off): exchange")
	})

	t.Run("no REPLICATION", func(t *testing.T) {
		t.Parallel()
		fs, _ := newFixture(t, pg, amqpURL, `ALTER ROLE {role} NOREPLICATION`).check(nil)
		f := has(t, fs, "privileges", preflight.Error, "lacks REPLICATION")
		want(t, fs, [2]string{"privileges", "lacks REPLICATION"})
		if !strings.HasPrefix(f.Remedy, "ALTER ROLE relay_") {
			t.Fatalf("remedy %q", f.Remedy)
		}
	})

	t.Run("no UPDATE (published_at)", func(t *testing.T) {
		t.Parallel()
		fs, _ := newFixture(t, pg, amqpURL, `REVOKE UPDATE (published_at) ON event_outbox FROM {role}`).check(nil)
		want(t, fs, [2]string{"privileges", "lacks UPDATE (published_at) on public.event_outbox"})
		has(t, fs, "privileges", preflight.Error, "remedy:GRANT UPDATE (published_at) ON public.event_outbox TO relay_")
	})

	t.Run("no SELECT nor DELETE", func(t *testing.T) {
		t.Parallel()
		fs, _ := newFixture(t, pg, amqpURL, `REVOKE SELECT, DELETE ON event_outbox FROM {role}`).check(nil)
		want(t, fs,
			[2]string{"privileges", "lacks SELECT on public.event_outbox"},
			[2]string{"privileges", "lacks DELETE on public.event_outbox"})
	})

	t.Run("missing table", func(t *testing.T) {
		t.Parallel()
		fs, _ := newFixture(t, pg, amqpURL, `DROP TABLE event_outbox`).check(nil)
		// Dropping the table also takes it out of the publication; a
		// publication cannot be the remedy for a table that is not there.
		want(t, fs,
			[2]string{"table", "public.event_outbox does not exist"},
			[2]string{"publication", "cannot cover public.event_outbox, which does not exist"})
		if f := has(t, fs, "publication", preflight.Error, "cannot cover"); !strings.Contains(f.Remedy, "or create public.event_outbox (`cdcrelay migrate`), then add it") {
			t.Errorf("remedy %q", f.Remedy)
		}
	})

	t.Run("slot with another plugin", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, pg, amqpURL)
		slotName := testenv.UniqueName("slot")
		f.exec(`SELECT pg_create_logical_replication_slot('` + slotName + `', 'test_decoding')`)
		t.Cleanup(func() { f.exec(`SELECT pg_drop_replication_slot('` + slotName + `')`) })
		fs, _ := f.check(map[string]string{"SLOT": slotName})
		want(t, fs, [2]string{"slot", "plugin test_decoding; the relay needs a logical pgoutput slot"})
	})

	t.Run("slot of another database", func(t *testing.T) {
		t.Parallel()
		other := newFixture(t, pg, amqpURL)
		slotName := testenv.UniqueName("slot")
		other.exec(`SELECT pg_create_logical_replication_slot('` + slotName + `', 'pgoutput')`)
		t.Cleanup(func() { other.exec(`SELECT pg_drop_replication_slot('` + slotName + `')`) })
		f := newFixture(t, pg, amqpURL)
		fs, _ := f.check(map[string]string{"SLOT": slotName})
		want(t, fs, [2]string{"slot", "belongs to database " + other.database + ", not " + f.database})
	})

	t.Run("active slot", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, pg, amqpURL)
		slotName := testenv.UniqueName("slot")
		stream(t, f.url(), slotName)
		fs, _ := f.check(map[string]string{"SLOT": slotName})
		want(t, fs)
		has(t, fs, "slot", preflight.OK, "another relay is streaming (hot standby will wait)")
		has(t, fs, "max_replication_slots", preflight.OK, "the relay's among them")
	})

	t.Run("missing exchange", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, pg, amqpURL)
		missing := testenv.UniqueName("cdcrelay.nosuch")
		fs, _ := f.check(map[string]string{"EXCHANGE": missing})
		want(t, fs, [2]string{"exchange", `exchange "` + missing + `" does not exist on vhost`})
	})

	t.Run("missing dead-letter exchange", func(t *testing.T) {
		t.Parallel()
		// run checks the dead-letter exchange at every connect and does not
		// start without it: check must say so too.
		f := newFixture(t, pg, amqpURL)
		missing := testenv.UniqueName("cdcrelay.nodlx")
		fs, _ := f.check(map[string]string{"DEAD_LETTER_EXCHANGE": missing})
		want(t, fs, [2]string{"exchange", `exchange "` + missing + `" does not exist on vhost`})
		has(t, fs, "exchange", preflight.Error, "remedy:or set CDCRELAY_DEAD_LETTER_EXCHANGE")
		has(t, fs, "exchange", preflight.OK, `exchange "`+f.exchange+`" exists`)
	})

	t.Run("amqps with a private CA and a client certificate", func(t *testing.T) {
		t.Parallel()
		// The files run uses (CDCRELAY_AMQP_TLS_*): check must use them too.
		ca, err := testenv.NewCA("cdcrelay check CA")
		if err != nil {
			t.Fatal(err)
		}
		certPEM, keyPEM, err := ca.Issue("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		term, err := testenv.NewTLSTerminator(brokerHostPort(t, amqpURL), certPEM, keyPEM, ca.PEM)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = term.Close() })
		dir := t.TempDir()
		write := func(name string, b []byte) string {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}
		u, err := url.Parse(amqpURL)
		if err != nil {
			t.Fatal(err)
		}
		u.Scheme, u.Host = "amqps", term.Addr()
		f := newFixture(t, pg, amqpURL)
		fs, _ := f.check(map[string]string{"AMQP_URL": u.String(),
			"AMQP_TLS_CA": write("ca.pem", ca.PEM), "AMQP_TLS_CERT": write("client.crt", certPEM), "AMQP_TLS_KEY": write("client.key", keyPEM)})
		want(t, fs)
		has(t, fs, "broker", preflight.OK, "connected to amqps://")
		has(t, fs, "exchange", preflight.OK, "exists")
	})

	t.Run("superuser without the table", func(t *testing.T) {
		t.Parallel()
		// A database the schema was never applied to: neither table nor
		// publication. Nothing may blame the role's privileges.
		f := newFixture(t, pg, amqpURL, `DROP PUBLICATION cdcrelay_outbox`, `DROP TABLE event_outbox`)
		fs, _ := f.check(map[string]string{"DATABASE_URL": pg.URL(f.database)})
		want(t, fs,
			[2]string{"table", "table public.event_outbox does not exist in database " + f.database},
			[2]string{"publication", "publication cdcrelay_outbox does not exist, nor does table public.event_outbox it must publish"})
		has(t, fs, "privileges", preflight.OK, "is a superuser")
		has(t, fs, "table", preflight.Error, "remedy:cdcrelay migrate")
		for _, f := range fs {
			for _, blame := range []string{"cannot create", "lacks", "privilege", "GRANT"} {
				if f.Severity != preflight.OK && strings.Contains(f.Message+f.Remedy, blame) {
					t.Errorf("%s finding blames privileges (%q): %s %s", f.Check, blame, f.Message, f.Remedy)
				}
			}
		}
	})

	t.Run("superuser", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, pg, amqpURL)
		fs, _ := f.check(map[string]string{"DATABASE_URL": pg.URL(f.database)})
		want(t, fs)
		has(t, fs, "privileges", preflight.OK, "is a superuser")
	})
}

// brokerHostPort is the host:port of an amqp:// URL.
func brokerHostPort(t *testing.T, amqpURL string) string {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// stream holds the slot active the way the relay does, until the test ends.
func stream(t *testing.T, dsn, slotName string) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = preflight.ReplicationApplicationName
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := pglogrepl.CreateReplicationSlot(ctx, conn, slotName, "pgoutput", pglogrepl.CreateReplicationSlotOptions{}); err != nil {
		t.Fatal(err)
	}
	err = pglogrepl.StartReplication(ctx, conn, slotName, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'cdcrelay_outbox'"},
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestIntegrationCheckWALLevelReplica(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{Settings: map[string]string{"wal_level": "replica"}})
	fs, _ := newFixture(t, pg, amqpURL).check(nil)
	want(t, fs, [2]string{"wal_level", "wal_level is replica; logical decoding (the relay's slot) needs logical"})
	has(t, fs, "wal_level", preflight.Error, "remedy:ALTER SYSTEM SET wal_level = logical;")
	// This cluster keeps the default max_slot_wal_keep_size.
	has(t, fs, "max_slot_wal_keep_size", preflight.Warn, "unset (-1)")
}

func TestIntegrationCheckSynchronousStandbyNamesTheRelay(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{Settings: map[string]string{
		"synchronous_standby_names": "FIRST 1 (standby1, cdcrelay)",
		"synchronous_commit":        "local", // let the fixture's own commits through
		"max_slot_wal_keep_size":    "1GB",
	}})
	fs, _ := newFixture(t, pg, amqpURL).check(nil)
	want(t, fs, [2]string{"synchronous_standby_names", "matches the relay's application_name cdcrelay (by cdcrelay)"})
}

// TestIntegrationCheckNeverPrintsSecrets points the checks at failing endpoints with
// passwords in the URLs: a closed port, a missing database, a broker that
// refuses the password, an AMQP URL that does not parse.
func TestIntegrationCheckNeverPrintsSecrets(t *testing.T) {
	amqpURL := testenv.RequireAMQP(t)
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	const secret = "Zq9-Very-Secret-Password"
	broker, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	broker.User = url.UserPassword(broker.User.Username(), secret)
	nosuchDB := "postgres://postgres:" + secret + "@127.0.0.1:" + strconv.Itoa(pg.Port()) + "/nosuchdb?sslmode=disable"
	for name, vars := range map[string]map[string]string{
		"closed ports": {
			"DATABASE_URL": "postgres://relay:" + secret + "@127.0.0.1:1/app?sslmode=disable",
			"AMQP_URL":     "amqp://relay:" + secret + "@127.0.0.1:1/",
		},
		"refused": {"DATABASE_URL": nosuchDB, "AMQP_URL": broker.String()},
		"key=value": {
			"DATABASE_URL": "host=127.0.0.1 port=1 user=relay password=" + secret + " dbname=app",
			"AMQP_URL":     broker.String(),
		},
	} {
		t.Run(name, func(t *testing.T) {
			fs, out := runChecks(t, vars)
			if strings.Contains(out, secret) {
				t.Fatalf("report contains the password:\n%s", out)
			}
			want(t, fs, [2]string{"database", "cannot connect to "}, [2]string{"broker", "cannot connect to "})
			if !strings.Contains(out, "xxxxx") && !strings.Contains(out, "host=127.0.0.1 port=1 user=relay dbname=app") {
				t.Fatalf("endpoints not named (redacted):\n%s", out)
			}
		})
	}
	// An AMQP URL net/url rejects: its parse error would quote it.
	cfg := config.Config{
		DatabaseURL: nosuchDB, AMQPURL: "amqp://relay:" + secret + "@127.0.0.1:notaport/",
		Table: "public.event_outbox", Publication: "cdcrelay_outbox", Slot: "cdcrelay_outbox",
		IDColumn: "id", RoutingKeyColumn: "routing_key", PayloadColumn: "payload",
	}
	var b bytes.Buffer
	preflight.Write(&b, preflight.Run(context.Background(), cfg, preflight.Options{Timeout: 5 * time.Second}))
	if strings.Contains(b.String(), secret) {
		t.Fatalf("report contains the password:\n%s", b.String())
	}
	t.Logf("unparseable AMQP URL:\n%s", b.String())
}
