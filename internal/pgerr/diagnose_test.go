package pgerr

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
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

// TestDiagnose: each cause gets the remedy that fixes it, naming the
// setting, and only those a retry cannot heal need an operator.
func TestDiagnose(t *testing.T) {
	const setting = "CDCRELAY_DATABASE_URL"
	pg := func(code, msg string) error {
		return fmt.Errorf("connect to database: %w", &pgconn.PgError{Severity: "FATAL", Code: code, Message: msg})
	}
	for _, tc := range []struct {
		name     string
		err      error
		remedy   string
		operator bool
	}{
		{"wrong password", pg(InvalidPassword, `password authentication failed for user "relay"`), "check the user and password in CDCRELAY_DATABASE_URL", true},
		{"pg_hba, TLS connection", pg(InvalidAuthorizationSpec, `no pg_hba.conf entry for host "10.0.0.1", user "relay", database "app", SSL encryption`), "allow this user, database and address in pg_hba.conf", true},
		{"pg_hba refuses no TLS", pg(InvalidAuthorizationSpec, `pg_hba.conf rejects connection for host "127.0.0.1", user "relay", database "app", no encryption`), "set sslmode=require in CDCRELAY_DATABASE_URL", true},
		{"no LOGIN", pg(InvalidAuthorizationSpec, `role "relay" is not permitted to log in`), "ALTER ROLE … LOGIN;", true},
		{"missing database", pg(InvalidCatalogName, `database "app" does not exist`), "check the database name in CDCRELAY_DATABASE_URL", true},
		{"no CONNECT", pg(InsufficientPrivilege, `permission denied for database "app"`), "GRANT CONNECT ON DATABASE", true},
		{"max_wal_senders", pg(TooManyConnections, "number of requested standby connections exceeds max_wal_senders (currently 1)"), "max_wal_senders", false},
		{"starting up", pg(CannotConnectNow, "the database system is starting up"), "wait for PostgreSQL", false},
		{"unknown CA", fmt.Errorf("tls: %w", x509.UnknownAuthorityError{}), "set sslrootcert in CDCRELAY_DATABASE_URL to the CA certificate", true},
		{"host not in SAN", fmt.Errorf("tls: %w", x509.HostnameError{Certificate: &x509.Certificate{DNSNames: []string{"db"}}, Host: "10.0.0.1"}), "subjectAltName (SAN)", true},
		{"expired", fmt.Errorf("tls: %w", x509.CertificateInvalidError{Reason: x509.Expired, Cert: &x509.Certificate{}}), "renew it; sslrootcert in CDCRELAY_DATABASE_URL", true},
		{"refused port", errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"), "check that PostgreSQL runs and is reachable at the host and port in CDCRELAY_DATABASE_URL", false},
	} {
		d := Diagnose(tc.err, setting)
		if !strings.Contains(d.Remedy, tc.remedy) || d.Operator != tc.operator || d.Cause == "" {
			t.Errorf("%s: Diagnose = %+v, want a remedy with %q, operator %v", tc.name, d, tc.remedy, tc.operator)
		}
		if strings.Contains(d.Remedy, "runs and is reachable") && strings.Contains(tc.remedy, "sslrootcert") {
			t.Errorf("%s: a certificate failure sent to the network", tc.name)
		}
	}
}

// TestIntegrationDiagnoseTLS runs the TLS failures against a real server
// with TLS on: a URL without TLS where pg_hba.conf refuses it, a
// certificate from an unknown CA, one that names its host only in the
// Common Name. Each remedy names the URL's TLS setting, not the network
// or pg_hba.conf.
func TestIntegrationDiagnoseTLS(t *testing.T) {
	ca, err := testenv.NewCA("pgerr test CA")
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
	cnPEM, cnKeyPEM := commonNameOnly(t, "127.0.0.1")
	dir, err := testenv.WriteServerFiles(map[string][]byte{"server.crt": certPEM, "server.key": keyPEM, "cn.crt": cnPEM, "cn.key": cnKeyPEM})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	client := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(client, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile, otherFile, cnFile := write("ca.pem", ca.PEM), write("other.pem", other.PEM), write("cn.pem", cnPEM)

	pg := testenv.MustPostgres(t, testenv.PostgresOptions{Settings: map[string]string{
		"ssl": "on", "ssl_cert_file": filepath.Join(dir, "server.crt"), "ssl_key_file": filepath.Join(dir, "server.key"),
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	hba := "local all all trust\nhostnossl all all 127.0.0.1/32 reject\nhostssl all all 127.0.0.1/32 trust\n"
	if err := os.WriteFile(filepath.Join(pg.DataDir(), "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	with := func(query map[string]string) string {
		u, err := url.Parse(pg.URL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		q := url.Values{}
		for k, v := range query {
			q.Set(k, v)
		}
		u.RawQuery = q.Encode()
		return u.String()
	}
	diagnose := func(t *testing.T, dsn string) Diagnosis {
		t.Helper()
		err := Connect(connect(ctx, t, dsn))
		d := Diagnose(err, "CDCRELAY_DATABASE_URL")
		t.Logf("%v\n→ %+v", err, d)
		if !d.Operator {
			t.Errorf("not an operator's: %+v", d)
		}
		if strings.Contains(d.Remedy, "reachable") {
			t.Errorf("a TLS failure sent to the network: %s", d.Remedy)
		}
		return d
	}

	t.Run("hostnossl reject, sslmode=disable", func(t *testing.T) {
		d := diagnose(t, with(map[string]string{"sslmode": "disable"}))
		if !strings.Contains(d.Remedy, "set sslmode=require in CDCRELAY_DATABASE_URL") || !strings.Contains(d.Cause, "no encryption") {
			t.Errorf("remedy %q", d.Remedy)
		}
	})
	t.Run("unknown CA", func(t *testing.T) {
		d := diagnose(t, with(map[string]string{"sslmode": "verify-full", "sslrootcert": otherFile}))
		if !strings.Contains(d.Remedy, "set sslrootcert in CDCRELAY_DATABASE_URL") {
			t.Errorf("remedy %q", d.Remedy)
		}
	})
	t.Run("the right CA connects", func(t *testing.T) {
		conn, err := pgconn.Connect(ctx, with(map[string]string{"sslmode": "verify-full", "sslrootcert": caFile}))
		if err != nil {
			t.Fatalf("the test's set-up is wrong: %v", err)
		}
		_ = conn.Close(ctx)
	})
	t.Run("legacy Common Name", func(t *testing.T) {
		if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER SYSTEM SET ssl_cert_file = '%s'`, filepath.Join(dir, "cn.crt"))); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER SYSTEM SET ssl_key_file = '%s'`, filepath.Join(dir, "cn.key"))); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond) // the postmaster loads the new certificate on SIGHUP
		d := diagnose(t, with(map[string]string{"sslmode": "verify-full", "sslrootcert": cnFile}))
		if !strings.Contains(d.Cause, "legacy Common Name") || !strings.Contains(d.Remedy, "subjectAltName (SAN)") || !strings.Contains(d.Remedy, "sslrootcert in CDCRELAY_DATABASE_URL") {
			t.Errorf("remedy %q", d.Remedy)
		}
	})
}

// commonNameOnly makes a self-signed certificate naming host in its
// Common Name only, as old certificates do; it is its own CA.
func commonNameOnly(t *testing.T, host string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}
