package relaytest

import (
	"context"
	"maps"
	"os"
	"strings"
	"testing"

	"github.com/sethvargo/go-envconfig"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// Vars is a relay's environment, without the CDCRELAY_ prefix: the
// connection settings and a free HTTP port, then each layer in turn (a
// later layer wins), typically the suite's defaults and the test's extras.
func Vars(dbURL, amqpURL, exchange string, layers ...map[string]string) map[string]string {
	v := map[string]string{
		"DATABASE_URL": dbURL, "AMQP_URL": amqpURL, "EXCHANGE": exchange, "HTTP_ADDR": "127.0.0.1:0",
	}
	for _, l := range layers {
		maps.Copy(v, l)
	}
	return v
}

// Config loads vars as the relay would read them from its environment.
func Config(t testing.TB, vars map[string]string) config.Config {
	t.Helper()
	m := make(map[string]string, len(vars))
	for k, v := range vars {
		m[config.Prefix+k] = v
	}
	cfg, err := config.LoadFrom(context.Background(), envconfig.MapLookuper(m))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// Environ is this process's environment plus vars, for the relay binary.
// The test environment's own CDCRELAY_* variables (CDCRELAY_TEST_AMQP_URL,
// CDCRELAY_RABBITMQ_BIN, …) are left out: the relay would warn of each as
// unknown, which tests of its warnings must not see.
func Environ(vars map[string]string) []string {
	known := map[string]bool{}
	for _, k := range config.Known() {
		known[k] = true
	}
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, config.Prefix) && !known[name] {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range vars {
		env = append(env, config.Prefix+k+"="+v)
	}
	return env
}
