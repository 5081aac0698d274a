// Package testenv provides the real services that cdcrelay's integration
// tests and `make demo` run against: a throwaway PostgreSQL cluster started
// from the server binaries on the machine, helpers for the RabbitMQ broker
// (reachability check, a recording consumer that survives broker restarts),
// and a TCP proxy that injects network faults.
//
// Nothing here mocks PostgreSQL or RabbitMQ. A missing service is reported as
// an error (or a test failure through the Must*/Require* wrappers), never as a
// skipped test, so CI cannot go green without having tested anything.
package testenv
