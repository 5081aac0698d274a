// Package testenv is the testing.TB layer over the service kit
// (internal/svckit): the real services cdcrelay's integration tests run
// against, a throwaway PostgreSQL cluster (svckit/pgcluster), private
// RabbitMQ nodes and helpers for the shared broker (svckit/brokernode), and
// TCP proxies that inject network faults (svckit/netproxy), each started
// for one test and removed at its cleanup (Must*, Require*), plus the test
// helpers on top: relay builds, child processes, metrics and slot waits.
// It re-exports the kit's names (kit.go), so a test needs this one import.
// The demos and the bench import the kit, not this package, so they do not
// link the testing package.
//
// Nothing here mocks PostgreSQL or RabbitMQ. A missing service is reported as
// an error (or a test failure through the Must*/Require* wrappers), never as a
// skipped test, so CI cannot go green without having tested anything.
package testenv
