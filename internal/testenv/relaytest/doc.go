// Package relaytest is the end-to-end kit the relay and fault tests share
// (internal/relay, internal/faults): a World (a throwaway PostgreSQL with
// the outbox schema, an exchange of its own on the broker and a consumer
// bound to it), the relay's environment and config from a map, the relay
// running in the test process, outbox inserts, waiting for deliveries and
// reading a delivery's commit position for the order checks.
//
// It sits apart from testenv because it imports the relay, config and
// migrations, which testenv (also used by the bench and demo binaries)
// should not. Every helper that starts a service goes through testenv, so
// the tests using it must be named TestIntegration…; docs/testing.md.
package relaytest
