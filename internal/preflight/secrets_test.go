package preflight

import (
	"bytes"
	"net/url"
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// TestScrubQueryParameterPasswords: passwords given as URL parameters
// (password=, sslpassword=, percent-encoded or not) and as key=value
// sslpassword are scrubbed from findings however a library quotes them,
// and the endpoint is still named.
func TestScrubQueryParameterPasswords(t *testing.T) {
	const q, ssl, kvSSL = "Q-S3cret/pw", "Ssl-S3cret+pw", "KvSsl-S3cret"
	for _, c := range []struct {
		dsn, shown string
		secrets    []string
	}{
		{"postgres://relay@db:5432/app?password=" + url.QueryEscape(q) + "&sslpassword=" + url.QueryEscape(ssl) + "&sslmode=require",
			"postgres://relay@db:5432/app?password=xxxxx&sslpassword=xxxxx&sslmode=require",
			[]string{q, url.QueryEscape(q), ssl, url.QueryEscape(ssl)}},
		{"host=db user=relay password=" + q + " sslpassword=" + kvSSL + " dbname=app",
			"host=db user=relay password=xxxxx sslpassword=xxxxx dbname=app", []string{q, kvSSL}},
	} {
		cfg := config.Config{DatabaseURL: c.dsn}
		fs := scrub([]Finding{
			{Check: "database", Message: "cannot connect to " + c.dsn + ": boom", Remedy: "check " + q},
			{Check: "tls", Message: "sslpassword " + strings.Join(c.secrets, " / ") + " did not decrypt the key"},
		}, cfg.Scrub)
		var b bytes.Buffer
		Write(&b, fs)
		for _, s := range c.secrets {
			if strings.Contains(b.String(), s) {
				t.Fatalf("output contains %q:\n%s", s, b.String())
			}
		}
		if !strings.Contains(b.String(), c.shown) {
			t.Fatalf("endpoint not shown as %q:\n%s", c.shown, b.String())
		}
	}
}
