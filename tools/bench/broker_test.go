package main

// The broker's choice, its validation and its name in the report: pure
// helpers, no broker needed.

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

func TestChooseBrokerPrecedence(t *testing.T) {
	const (
		flagURL  = "amqp://f:fpw@flag.example:5672/"
		benchURL = "amqp://b:bpw@127.0.0.1:5870/"
		testURL  = "amqp://t:tpw@127.0.0.1:5999/"
	)
	env := func(vars map[string]string) func(string) string {
		return func(k string) string { return vars[k] }
	}
	both := map[string]string{benchAMQPURLEnv: benchURL, testenv.AMQPURLEnv: testURL}
	for _, c := range []struct {
		name      string
		flagValue string
		flagSet   bool
		env       map[string]string
		want      brokerChoice
	}{
		{"flag wins over both variables", flagURL, true, both, brokerChoice{flagURL, "-amqp-url"}},
		{"BENCH_AMQP_URL wins over the tests' variable", "", false, both, brokerChoice{benchURL, "$BENCH_AMQP_URL"}},
		{"the tests' variable as before", "", false, map[string]string{testenv.AMQPURLEnv: testURL}, brokerChoice{testURL, "$CDCRELAY_TEST_AMQP_URL"}},
		{"empty BENCH_AMQP_URL is unset", "", false, map[string]string{benchAMQPURLEnv: ""}, brokerChoice{testenv.DefaultAMQPURL, "default"}},
		{"default: the local guest account", "", false, nil, brokerChoice{testenv.DefaultAMQPURL, "default"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := chooseBroker(c.flagValue, c.flagSet, env(c.env))
			if err != nil || got != c.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

func TestChooseBrokerRejectsAndNamesTheSource(t *testing.T) {
	// An explicitly empty flag is not the default: -amqp-url=$UNSET.
	if _, err := chooseBroker("", true, func(string) string { return "" }); err == nil || !strings.HasPrefix(err.Error(), "-amqp-url: empty AMQP URL") {
		t.Fatalf("empty flag: %v", err)
	}
	bad := func(k string) string {
		if k == benchAMQPURLEnv {
			return "http://user:hunter2@127.0.0.1:5672/"
		}
		return ""
	}
	_, err := chooseBroker("", false, bad)
	if err == nil || !strings.HasPrefix(err.Error(), "$BENCH_AMQP_URL: invalid AMQP URL") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("bad variable: %v", err)
	}
}

func TestValidateAMQPURL(t *testing.T) {
	for _, ok := range []string{
		testenv.DefaultAMQPURL,
		"amqp://guest:guest@127.0.0.1:5870/",
		"amqps://relay:s%40cret@broker.example/prod",
		"amqp://broker.example",
		"amqp://u:p@[::1]:5672/",
	} {
		if err := validateAMQPURL(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	// Every bad URL carries the password s3cret (or a piece of it); no
	// error may quote it, and each says what is wrong.
	for _, c := range []struct{ url, want string }{
		{"", "empty AMQP URL"},
		{"http://u:s3cret@127.0.0.1:5672/", "the scheme is not amqp or amqps"},
		{"u:s3cret@127.0.0.1:5672", "the scheme is not amqp or amqps"},
		{"amqp://u:s3cret@/", "no host"},
		{"amqp://u:s3c ret@127.0.0.1/", "contains whitespace"},
		{"amqp://u:s3%zzcret@127.0.0.1/", "not a URL"},
		{"amqp://u:s3cret@127.0.0.1:5672,127.0.0.1:5673/", "several nodes"},
		{"amqp://u:s3#cret@127.0.0.1/", "an unescaped '#' or '@'"},
		{"amqp://u:s3@cret@127.0.0.1/", "an unescaped '#' or '@'"},
		{"amqp://u:s3cret@127.0.0.1:99999/", "the port is not in 1..65535"},
		{"amqp://u:s3cret@127.0.0.1:5672/?heartbeat=s3cret", "invalid AMQP URL"},
	} {
		err := validateAMQPURL(c.url)
		if err == nil {
			t.Errorf("%q: accepted", c.url)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, c.want) || !strings.Contains(msg, "want amqp://user:password@host:port/vhost") {
			t.Errorf("%q: %q, want it to say %q and the expected form", c.url, msg, c.want)
		}
		for _, piece := range []string{"s3cret", "s3c", "cret", "%zz"} {
			if strings.Contains(msg, piece) {
				t.Errorf("%q: the error quotes the password: %q", c.url, msg)
				break
			}
		}
	}
	// Without a userinfo net/url's reason is safe to show, and helps.
	if err := validateAMQPURL("amqp://127.0.0.1:port/"); err == nil || !strings.Contains(err.Error(), "invalid port") {
		t.Errorf("bad port without userinfo: %v", err)
	}
}

func TestRedactedURLKeepsTheUserOnly(t *testing.T) {
	got := redactedURL("amqp://relay:s3cret@127.0.0.1:5870/prod")
	if strings.Contains(got, "s3cret") || !strings.Contains(got, "relay:") || !strings.Contains(got, "127.0.0.1:5870/prod") {
		t.Fatalf("redacted %q", got)
	}
	if got := redactedURL(testenv.DefaultAMQPURL); got != "amqp://guest:xxxxx@127.0.0.1:5672/" {
		t.Fatalf("redacted default %q", got)
	}
}

func TestBrokerName(t *testing.T) {
	for _, c := range []struct {
		props amqp.Table
		want  string
	}{
		{amqp.Table{"product": "RabbitMQ", "version": "3.10.8", "platform": "Erlang/OTP 24"}, "RabbitMQ 3.10.8"},
		{amqp.Table{"product": []byte("RabbitMQ"), "version": []byte("4.3.0")}, "RabbitMQ 4.3.0"},
		{amqp.Table{"product": "RabbitMQ\n", "version": " 4.1.0\r\x00"}, "RabbitMQ 4.1.0"},
		{amqp.Table{"product": "RabbitMQ"}, "RabbitMQ (version not reported)"},
		{amqp.Table{"version": "4.0.5"}, "unknown product 4.0.5"},
		{amqp.Table{"product": int32(7)}, "unknown broker (no product or version in its handshake)"},
		{nil, "unknown broker (no product or version in its handshake)"},
	} {
		if got := brokerName(c.props); got != c.want {
			t.Errorf("brokerName(%v) = %q, want %q", c.props, got, c.want)
		}
	}
}

func TestBrokerLine(t *testing.T) {
	m := machineInfo{broker: "RabbitMQ 4.3.0", brokerAt: "amqp://guest:xxxxx@127.0.0.1:5870/", brokerBy: "$BENCH_AMQP_URL"}
	want := "broker:     RabbitMQ 4.3.0 at amqp://guest:xxxxx@127.0.0.1:5870/ (from $BENCH_AMQP_URL)\n"
	if got := brokerLine(m); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
