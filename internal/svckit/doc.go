// Package svckit is the service kit: what starts and drives the real
// services that the demos, the bench (tools/bench) and the integration tests
// run against, without the testing package. Its subpackages hold the
// services: pgcluster (throwaway PostgreSQL clusters and their standbys),
// brokernode (private RabbitMQ nodes and clusters, and the client helpers
// every broker needs) and netproxy (TCP proxies that inject network faults
// or terminate TLS). This package holds the small parts they share.
//
// internal/testenv is the testing.TB layer on top (Must*, Require*, cleanups
// that log a failed test's server log); the binaries under cmd/ and tools/
// import this kit only, so they do not link the testing package (a
// repocheck test holds that).
package svckit
