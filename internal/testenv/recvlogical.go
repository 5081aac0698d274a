package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// StartRecvLogical runs the cluster's own pg_recvlogical on url, streaming
// slot (pgoutput, publication pub) to nowhere: a client that is not a relay
// holding the relay's slot, as an operator's debugging session or a
// forgotten tool would. It confirms what it receives, as it does for real.
// The test's cleanup kills it; Kill ends it earlier.
func (p *Postgres) StartRecvLogical(tb testing.TB, url, slot, pub string) *Process {
	tb.Helper()
	bin := filepath.Join(p.BinDir(), "pg_recvlogical")
	if _, err := os.Stat(bin); err != nil {
		tb.Fatalf("pg_recvlogical is not in %s: %v", p.BinDir(), err)
	}
	return StartProcess(tb, bin, os.Environ(), "--dbname", url, "--slot", slot, "--start", "--no-loop",
		"--file", os.DevNull, "--status-interval", "1",
		"--option", "proto_version=1", "--option", "publication_names="+pub)
}
