// Package toolkit holds what the bench (tools/bench) and the demo
// (cmd/cdcrelay-demo) both need around a relay they run as a child process:
// starting and stopping `cdcrelay run`, the CDCRELAY_* environment it gets,
// and the latency formatting both print. The log buffer safe for concurrent
// writes that both pass to Start is svckit.Buffer. It is tooling, not part
// of the relay: nothing under cmd/cdcrelay imports it.
package toolkit
