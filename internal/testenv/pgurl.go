package testenv

import (
	"net/url"
	"testing"
)

// WithApplicationName returns the PostgreSQL URL raw with application_name
// app, so that pg_stat_activity tells the backends of one relay or monitor
// apart from another's.
func WithApplicationName(tb testing.TB, raw, app string) string {
	tb.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		tb.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String()
}
