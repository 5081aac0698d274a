// Package toolkit holds what the bench (cmd/cdcrelay-bench) and the demo
// (cmd/cdcrelay-demo) both need around a relay they run as a child process:
// starting and stopping `cdcrelay run`, the CDCRELAY_* environment it gets,
// a log buffer safe for concurrent writes, and the latency formatting both
// print. It is tooling, not part of the relay: nothing under cmd/cdcrelay
// imports it.
package toolkit
