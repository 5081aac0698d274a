package preflight

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/sethvargo/go-envconfig"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// brokerLimit is the private node's max_message_size, well below the
// relay's default CDCRELAY_MAX_MESSAGE_BYTES (16 MiB).
const brokerLimit = 1 << 20

// mgmtPassword is the management user's password; no finding may show it.
const mgmtPassword = "Mgmt-Secret-9d2e"

// TestIntegrationCheckBrokerLimits runs check's broker topology and
// max_message_size findings against one private node with the management
// plugin and max_message_size = 1 MiB: queues fed by the relay's exchange
// (directly and through an exchange-to-exchange binding) with length
// limits by argument and by policy, a dead-letter exchange with and
// without a binding, and the size probe above, at and below the limit and
// without permission to publish to the default exchange.
func TestIntegrationCheckBrokerLimits(t *testing.T) {
	node := testenv.MustRabbitMQManagement(t, testenv.RabbitMQOptions{Config: map[string]string{"max_message_size": fmt.Sprint(brokerLimit)}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ctl := func(args ...string) {
		t.Helper()
		if _, err := node.Ctl(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
	ctl("add_user", "monitor", mgmtPassword)
	ctl("set_user_tags", "monitor", "monitoring")
	ctl("set_permissions", "-p", "/", "monitor", "", "", ".*")
	// narrow may write to the relay's exchange only, as a least-privilege
	// relay user would: not to the default exchange the probe uses.
	ctl("add_user", "narrow", "Narrow-Pw-77")
	ctl("set_permissions", "-p", "/", "narrow", "", "^events$", "")
	mgmtURL := strings.Replace(node.ManagementURL(), "guest:guest@", "monitor:"+mgmtPassword+"@", 1)

	_, ch := testenv.MustChannel(t, node.URL())
	declare := func(name string, args amqp.Table, from string) {
		t.Helper()
		if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(name, "#", from, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, ex := range []string{"events", "fanout", "dlx"} {
		if err := ch.ExchangeDeclare(ex, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.ExchangeBind("fanout", "#", "events", false, nil); err != nil {
		t.Fatal(err)
	}
	declare("plain", nil, "events")
	declare("capped", amqp.Table{"x-max-length": int32(10)}, "events")
	declare("refusing", amqp.Table{"x-max-length": int32(10), "x-overflow": "reject-publish"}, "events")
	declare("refusing-dlx", amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish-dlx"}, "fanout")
	declare("by-policy", nil, "fanout")
	ctl("set_policy", "-p", "/", "--apply-to", "queues", "cap", "^by-policy$", `{"max-length-bytes":1000000}`)

	// No database: its checks fail at once (nothing listens on port 1) and
	// this test reads only the broker's findings.
	base := map[string]string{"DATABASE_URL": "postgres://relay@127.0.0.1:1/app", "AMQP_URL": node.URL(), "EXCHANGE": "events", "DEAD_LETTER_EXCHANGE": "dlx"}
	cfg := loadConfig(t, base)
	opts := Options{Timeout: 10 * time.Second}

	t.Run("topology", func(t *testing.T) {
		var fs []Finding
		// A policy reaches the queue's effective definition asynchronously.
		deadline := time.Now().Add(10 * time.Second)
		for {
			fs = topologyChecks(ctx, cfg, mgmtURL, opts)
			if hasFinding(fs, Warn, `queue "by-policy"`) || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		out := report(t, fs)
		for _, want := range []string{
			`dead-letter exchange "dlx" (CDCRELAY_DEAD_LETTER_EXCHANGE) has no binding`,
			`queue "by-policy", bound to exchange "events", has max-length-bytes=1000000 (policy "cap") and overflow drop-head (the default)`,
			`queue "capped", bound to exchange "events", has x-max-length=10 (argument) and overflow drop-head (the default)`,
		} {
			if !hasFinding(fs, Warn, want) {
				t.Errorf("no warning with %q", want)
			}
		}
		if n := countSeverity(fs, Warn); n != 3 {
			t.Errorf("%d warnings, want 3", n)
		}
		for _, want := range []string{`queue "refusing", bound`, `queue "refusing-dlx", bound`, `5 queue(s) bound to exchange "events"`} {
			if !hasFinding(fs, OK, want) {
				t.Errorf("no OK finding with %q", want)
			}
		}
		if strings.Contains(out, "plain") {
			t.Errorf("a queue without a limit is reported")
		}
		if f := findingWith(fs, `queue "capped"`); !strings.Contains(f.Remedy, "reject-publish") {
			t.Errorf("remedy %q does not name reject-publish", f.Remedy)
		}
		if f := findingWith(fs, `queue "by-policy"`); !strings.Contains(f.Remedy, `policy "cap"`) {
			t.Errorf("remedy %q does not name the queue's policy", f.Remedy)
		}

		declare("parked", nil, "dlx")
		fs = topologyChecks(ctx, cfg, mgmtURL, opts)
		report(t, fs)
		if !hasFinding(fs, OK, `dead-letter exchange "dlx" has 1 binding(s)`) || hasFinding(fs, Warn, "dead-letter") {
			t.Errorf("a bound dead-letter exchange is not reported as such")
		}

		fs = topologyChecks(ctx, cfg, strings.Replace(mgmtURL, mgmtPassword, "wrong-password", 1), opts)
		report(t, fs)
		if len(fs) != 1 || !hasFinding(fs, Warn, "401") {
			t.Errorf("a refused management login is not one warning")
		}

		fs = topologyChecks(ctx, cfg, "", opts)
		if len(fs) != 1 || !hasFinding(fs, OK, "not checked") {
			t.Errorf("without a management URL: %+v", fs)
		}
	})

	// What the findings promise about reject-publish-dlx: a full queue
	// nacks the publisher (the relay retries) as reject-publish does.
	t.Run("reject-publish-dlx nacks", func(t *testing.T) {
		_, pch := testenv.MustChannel(t, node.URL())
		if err := pch.Confirm(false); err != nil {
			t.Fatal(err)
		}
		var acks []bool
		for i := range 2 {
			dc, err := pch.PublishWithDeferredConfirmWithContext(ctx, "", "refusing-dlx", false, false, amqp.Publishing{Body: []byte{byte(i)}})
			if err != nil {
				t.Fatal(err)
			}
			ok, err := dc.WaitContext(ctx)
			if err != nil {
				t.Fatal(err)
			}
			acks = append(acks, ok)
		}
		if !acks[0] || acks[1] {
			t.Fatalf("confirms %v for two publishes to a full queue of one with reject-publish-dlx; want ack, nack", acks)
		}
	})

	t.Run("max_message_size", func(t *testing.T) {
		check := func(vars map[string]string) Finding {
			t.Helper()
			v := map[string]string{}
			for k, val := range base {
				v[k] = val
			}
			for k, val := range vars {
				v[k] = val
			}
			fs := Run(ctx, loadConfig(t, v), opts)
			report(t, fs)
			for _, f := range fs {
				if f.Check == checkMaxMessageSize {
					return f
				}
			}
			t.Fatal("no max_message_size finding")
			return Finding{}
		}
		f := check(nil) // the default, 16 MiB
		want := fmt.Sprintf("CDCRELAY_MAX_MESSAGE_BYTES (%d) is above the broker's max_message_size (%d): rows between %d and %d bytes are refused by the broker", 16<<20, brokerLimit, brokerLimit, 16<<20)
		if f.Severity != Warn || f.Message != want || !strings.Contains(f.Remedy, fmt.Sprintf("at most %d", brokerLimit)) {
			t.Errorf("default limit: %+v; want a warning %q", f, want)
		}
		if f := check(map[string]string{"MAX_MESSAGE_BYTES": fmt.Sprint(brokerLimit)}); f.Severity != OK || !strings.Contains(f.Message, "takes a message") {
			t.Errorf("a limit equal to the broker's: %+v", f)
		}
		if f := check(map[string]string{"MAX_MESSAGE_BYTES": fmt.Sprint(brokerLimit + 1)}); f.Severity != Warn || !strings.Contains(f.Message, fmt.Sprintf("(%d)", brokerLimit)) {
			t.Errorf("a limit one byte above the broker's: %+v", f)
		}
		// RabbitMQ judges the size before the permission: a message too
		// large is refused as such whoever sends it, one that fits is
		// refused for the permission.
		narrow := strings.Replace(node.URL(), "guest:guest@", "narrow:Narrow-Pw-77@", 1)
		if f := check(map[string]string{"AMQP_URL": narrow}); f.Severity != Warn || !strings.Contains(f.Message, fmt.Sprintf("(%d)", brokerLimit)) {
			t.Errorf("too large, without write permission on the default exchange: %+v", f)
		}
		if f := check(map[string]string{"AMQP_URL": narrow, "MAX_MESSAGE_BYTES": "1000"}); f.Severity != OK || !strings.Contains(f.Message, "could not probe") {
			t.Errorf("fits, without write permission on the default exchange: %+v", f)
		}
		// The probe left nothing behind: every queue holds only what this
		// test published itself.
		q, err := ch.QueueDeclarePassive("plain", true, false, false, false, nil)
		if err != nil || q.Messages != 0 {
			t.Errorf("queue plain after the probes: %d messages, %v", q.Messages, err)
		}
	})
}

// loadConfig reads vars (without the prefix) as the relay would.
func loadConfig(t *testing.T, vars map[string]string) config.Config {
	t.Helper()
	env := map[string]string{}
	for k, v := range vars {
		env[config.Prefix+k] = v
	}
	cfg, err := config.LoadFrom(context.Background(), envconfig.MapLookuper(env))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// report logs the findings as check prints them and fails if any shows the
// management password.
func report(t *testing.T, fs []Finding) string {
	t.Helper()
	var b bytes.Buffer
	Write(&b, fs)
	t.Logf("findings:\n%s", b.String())
	if strings.Contains(b.String(), mgmtPassword) {
		t.Fatal("the findings show the management password")
	}
	return b.String()
}

func hasFinding(fs []Finding, sev Severity, fragment string) bool {
	for _, f := range fs {
		if f.Severity == sev && strings.Contains(f.Message, fragment) {
			return true
		}
	}
	return false
}

func countSeverity(fs []Finding, sev Severity) int {
	n := 0
	for _, f := range fs {
		if f.Severity == sev {
			n++
		}
	}
	return n
}

func findingWith(fs []Finding, fragment string) Finding {
	for _, f := range fs {
		if strings.Contains(f.Message, fragment) {
			return f
		}
	}
	return Finding{}
}
