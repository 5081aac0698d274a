package relay

import (
	"errors"
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

func TestRetryDetail(t *testing.T) {
	r := &Relay{cfg: config.Config{DatabaseURL: "postgres://relay:s3cr%40t@db/app", AMQPURL: "amqp://relay:amqp-pw@mq/"}}
	cases := []struct {
		err        error
		want, nope string
	}{
		{errors.New("dial: password s3cr@t refused,\nand amqp-pw too"), "retrying after: dial: password xxxxx refused, and xxxxx too", "s3cr"},
		{errors.New(strings.Repeat("é", 300)), "retrying after: " + strings.Repeat("é", retryDetailMax) + "…", "éé…é"},
	}
	for _, c := range cases {
		got := r.retryDetail(c.err)
		if got != c.want || strings.Contains(got, c.nope) {
			t.Errorf("retryDetail(%q) = %q, want %q", c.err, got, c.want)
		}
	}
}

// TestRetryDetailOverlappingPasswords: a password that contains the other
// URL's is scrubbed whole, not left with a visible tail.
func TestRetryDetailOverlappingPasswords(t *testing.T) {
	r := &Relay{cfg: config.Config{DatabaseURL: "postgres://relay:abcd@db/app", AMQPURL: "amqp://relay:abcdefgh@mq/"}}
	got := r.retryDetail(errors.New("broker refused abcdefgh"))
	if got != "retrying after: broker refused xxxxx" {
		t.Errorf("retryDetail = %q", got)
	}
}
