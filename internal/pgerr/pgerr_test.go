package pgerr

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// TestIntegrationConnectLeadsWithTheCause connects with the default sslmode=prefer
// to a real server without TLS: a wrong password and a missing database
// must be reported alone, without the TLS refusal that has nothing to do
// with them, and the SQLSTATE kept; a pg_hba.conf that wants TLS from a
// server without it keeps the refusal, which is then the story.
func TestIntegrationConnectLeadsWithTheCause(t *testing.T) {
	pg := testenv.MustPostgres(t, testenv.PostgresOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	if _, err := admin.Exec(ctx, `CREATE ROLE pgerr_user LOGIN PASSWORD 'right-password'`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `CREATE ROLE pgerr_tls LOGIN`); err != nil {
		t.Fatal(err)
	}
	// initdb's trust for everyone would accept any password: ask this
	// role for one over TCP.
	hba := "local all all trust\nhost all pgerr_user 127.0.0.1/32 scram-sha-256\nhostnossl all pgerr_tls 127.0.0.1/32 reject\nhost all all 127.0.0.1/32 trust\n"
	if err := os.WriteFile(filepath.Join(pg.DataDir(), "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	var ssl string
	if err := admin.QueryRow(ctx, `SHOW ssl`).Scan(&ssl); err != nil || ssl != "off" {
		t.Fatalf("the test needs a server without TLS: ssl = %q, %v", ssl, err)
	}
	// pg.URL pins sslmode=disable; the relay's users leave the default.
	prefer := func(user, password, database string) string {
		u, err := url.Parse(pg.URL(database))
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(user, password)
		u.RawQuery = ""
		return u.String()
	}

	for _, tc := range []struct {
		name, url, cause, sqlstate string
	}{
		{"wrong password", prefer("pgerr_user", "wrong-password", "postgres"), "password authentication failed", "28P01"},
		{"missing database", prefer("postgres", "", "no_such_db"), `database "no_such_db" does not exist`, "3D000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := connect(ctx, t, tc.url)
			if !strings.Contains(raw.Error(), tlsRefused) || strings.Index(raw.Error(), tlsRefused) > strings.Index(raw.Error(), tc.cause) {
				t.Fatalf("pgconn no longer puts the TLS refusal first; revisit this package:\n%v", raw)
			}
			err := Connect(raw)
			msg := err.Error()
			t.Logf("pgconn: %v\nreported: %v", raw, msg)
			// One line, the cause, and no word of TLS: the server has
			// none, and the failure is not about it.
			if !strings.Contains(msg, tc.cause) || strings.Contains(msg, "\n") || strings.Contains(msg, "TLS") {
				t.Fatalf("the cause %q is not reported alone:\n%s", tc.cause, msg)
			}
			var pgErr *pgconn.PgError
			var ce *pgconn.ConnectError
			if !errors.As(err, &pgErr) || pgErr.Code != tc.sqlstate || !errors.As(err, &ce) {
				t.Fatalf("lost the chain: %v", err)
			}
			if strings.Contains(msg, "wrong-password") {
				t.Fatal("the message contains the password")
			}
		})
	}

	t.Run("pg_hba wants TLS the server lacks", func(t *testing.T) {
		raw := connect(ctx, t, prefer("pgerr_tls", "", "postgres"))
		err := Connect(raw)
		msg := err.Error()
		if !strings.Contains(msg, "no encryption") || !strings.Contains(msg, "the server refused it: it has TLS off") {
			t.Fatalf("the refusal is the story here and is not told:\n%s", msg)
		}
		d := Diagnose(err, "CDCRELAY_DATABASE_URL")
		if !d.Operator || !strings.Contains(d.Remedy, "turn ssl on in postgresql.conf") {
			t.Fatalf("Diagnose = %+v", d)
		}
	})
	t.Run("one attempt unchanged", func(t *testing.T) {
		u, err := url.Parse(pg.URL("postgres")) // sslmode=disable: one attempt
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword("pgerr_user", "wrong-password")
		raw := connect(ctx, t, u.String())
		if err := Connect(raw); !errors.Is(err, raw) || err.Error() != raw.Error() {
			t.Fatalf("Connect changed %v into %v", raw, err)
		}
	})
	t.Run("missing database: the remedy", func(t *testing.T) {
		raw := connect(ctx, t, pg.URL("no_such_db"))
		err := Connect(raw)
		var pgErr *pgconn.PgError
		if !errors.Is(err, raw) || !errors.As(err, &pgErr) || pgErr.Code != InvalidCatalogName ||
			!strings.HasPrefix(err.Error(), raw.Error()+`: create it (CREATE DATABASE "no_such_db"; as a role with CREATEDB)`) {
			t.Fatalf("Connect(%v) = %v", raw, err)
		}
	})
	t.Run("not a connection error", func(t *testing.T) {
		other := errors.New("something else")
		if err := Connect(other); !errors.Is(err, other) || err.Error() != other.Error() {
			t.Fatalf("Connect changed %v", err)
		}
	})
}

func connect(ctx context.Context, t *testing.T, dsn string) error {
	t.Helper()
	conn, err := pgconn.Connect(ctx, dsn)
	if err == nil {
		_ = conn.Close(ctx)
		t.Fatalf("connected to %s", dsn)
	}
	return err
}
