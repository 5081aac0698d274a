// Package faults_test is cdcrelay's fault matrix: each test runs
// at least 1,000 events around one failure of PostgreSQL, the broker, the
// network between them or the relay itself, then checks from the database
// that every outbox row reached a consumer, counts duplicates and checks
// that first deliveries kept commit order. Each test logs one line
//
//	FAULT <name>: events=… lost=… duplicates=… reordered=… recover=…
//
// and, when CDCRELAY_FAULTS_REPORT names a file, appends it there as JSON;
// docs/reliability.md is filled from those lines.
//
// The quick tests run in `make test`; the slow ones carry the build tag
// `faults` and run under `make test-faults`.
package faults_test

import (
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

const slotName = "cdcrelay_outbox"

// builds holds the relay binaries the process tests (build tag faults)
// build; TestMain removes them.
var builds testenv.Builds

func TestMain(m *testing.M) { builds.Main(m) }
