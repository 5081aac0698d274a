// Package faults holds cdcrelay's fault matrix and no code of its own: its
// tests (package faults_test) run at least 1,000 events around one failure
// of PostgreSQL, the broker, the network between them or the relay itself,
// then check from the database that every outbox row reached a consumer,
// count duplicates and check that first deliveries kept commit order.
//
// The quick tests run with the rest of the suite; the slow ones (real broker
// outages, SIGKILL at exact points of the code) need the build tags faults
// and failpoints (make test-faults). docs/reliability.md reports the results.
package faults
