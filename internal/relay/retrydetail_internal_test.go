package relay

import (
	"errors"
	"fmt"
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
		// An operator's condition, wrapped on its way up: the problem and
		// the remedy, not the server's error, and room for a longer remedy.
		{fmt.Errorf("open replication connection: %w", &OperatorError{Problem: "role relay lacks REPLICATION", Remedy: "ALTER ROLE relay REPLICATION; (s3cr@t)",
			Err: errors.New("permission denied to start WAL sender")}), "needs an operator: role relay lacks REPLICATION; ALTER ROLE relay REPLICATION; (xxxxx)", "WAL sender"},
		{&OperatorError{Problem: "p", Remedy: strings.Repeat("r", 300)}, "needs an operator: p; " + strings.Repeat("r", 300), "…"},
		{&OperatorError{Problem: "p", Remedy: strings.Repeat("r", 500)}, "needs an operator: p; " + strings.Repeat("r", 500), "…"},
		{&OperatorError{Problem: "p", Remedy: strings.Repeat("r", 700)}, "needs an operator: p; " + strings.Repeat("r", operatorDetailMax-3) + "…", "rrrrr\n"},
	}
	for _, c := range cases {
		reason, got := r.retryDetail(c.err)
		if got != c.want || strings.Contains(got, c.nope) {
			t.Errorf("retryDetail(%q) = %q, want %q", c.err, got, c.want)
		}
		// The reason follows the prefix: an operator's condition is never
		// counted as a retry that may heal by itself.
		if want := map[bool]Reason{true: ReasonNeedsOperator, false: ReasonRetrying}[strings.HasPrefix(c.want, "needs an operator")]; reason != want {
			t.Errorf("retryDetail(%q) reason %q, want %q", c.err, reason, want)
		}
	}
}

// TestRetryDetailOverlappingPasswords: a password that contains the other
// URL's is scrubbed whole, not left with a visible tail.
func TestRetryDetailOverlappingPasswords(t *testing.T) {
	r := &Relay{cfg: config.Config{DatabaseURL: "postgres://relay:abcd@db/app", AMQPURL: "amqp://relay:abcdefgh@mq/"}}
	_, got := r.retryDetail(errors.New("broker refused abcdefgh"))
	if got != "retrying after: broker refused xxxxx" {
		t.Errorf("retryDetail = %q", got)
	}
}
