package publish

import "testing"

func TestBrokerMaxMessageSize(t *testing.T) {
	for _, c := range []struct {
		name   string
		reason string
		limit  int64
		ok     bool
	}{
		{"3.x and 4.x reason", "PRECONDITION_FAILED - message size 1048577 is larger than configured max size 1048576", 1048576, true},
		{"as amqp091-go's Error() quotes it", `Exception (406) Reason: "PRECONDITION_FAILED - message size 20000000 is larger than configured max size 16777216"`, 16777216, true},
		{"older wording", "PRECONDITION_FAILED - message size 300 larger than max size 200", 200, true},
		{"without the configured word", "message size 300 is larger than max size 200", 200, true},
		{"the 4.x default", "PRECONDITION_FAILED - message size 16777217 is larger than configured max size 16777216", 16777216, true},
		{"another precondition", "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'events'", 0, false},
		{"no access", "ACCESS_REFUSED - access to exchange 'amq.default' in vhost '/' refused for user 'relay'", 0, false},
		{"empty", "", 0, false},
		{"limit beyond int64", "message size 1 is larger than configured max size 99999999999999999999", 0, false},
		{"zero limit", "message size 1 is larger than configured max size 0", 0, false},
		{"number cut off", "message size 300 is larger than configured max size ", 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			limit, ok := BrokerMaxMessageSize(c.reason)
			if limit != c.limit || ok != c.ok {
				t.Fatalf("BrokerMaxMessageSize(%q) = %d, %v; want %d, %v", c.reason, limit, ok, c.limit, c.ok)
			}
		})
	}
}
