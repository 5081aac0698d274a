package testenv

import (
	"strings"
	"testing"
)

// IntegrationPrefix starts the name of every test that needs a service:
// PostgreSQL, RabbitMQ or a built binary. `make test-unit` runs
// `go test -skip '^TestIntegration' ./...`, which stays service-free only
// while every such test carries the prefix; docs/testing.md, "The
// TestIntegration rule".
const IntegrationPrefix = "TestIntegration"

// integrationPrefixes are the top-level names allowed to start services:
// tests and benchmarks that say so in their name.
var integrationPrefixes = []string{IntegrationPrefix, "BenchmarkIntegration"}

// RequireIntegration fails tb unless its top-level test is named
// TestIntegration… (or BenchmarkIntegration…). Every service constructor
// calls it, so a service test without the prefix fails at once, naming the
// fix, instead of breaking the service-free unit run later.
func RequireIntegration(tb testing.TB, what string) {
	tb.Helper()
	top, _, _ := strings.Cut(tb.Name(), "/")
	for _, p := range integrationPrefixes {
		if strings.HasPrefix(top, p) {
			return
		}
	}
	tb.Fatalf("%s needs a service, so %s must be named %s… (docs/testing.md, \"The TestIntegration rule\")", what, top, IntegrationPrefix)
}
