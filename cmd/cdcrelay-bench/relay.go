package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

// relayProc is a running `cdcrelay run` and its log.
type relayProc struct {
	*toolkit.Proc
	log *toolkit.Buffer
}

// startRelay starts `bin run` with env. Its log (LOG_LEVEL=warn, so
// normally empty) is kept and shown if the bench fails.
func startRelay(bin string, env []string) (*relayProc, error) {
	log := &toolkit.Buffer{}
	p, err := toolkit.Start(bin, env, "run", log)
	if err != nil {
		return nil, err
	}
	return &relayProc{Proc: p, log: log}, nil
}

// stop sends SIGTERM and waits for a graceful exit, killing the relay if
// it takes longer than ctx allows.
func (r *relayProc) stop(ctx context.Context) error {
	if err := r.Stop(ctx); err != nil {
		return err
	}
	return r.exitError()
}

// exitError is how the relay exited, with the end of its log; nil while it
// runs or when it exited cleanly.
func (r *relayProc) exitError() error {
	if err := r.Err(); err != nil {
		return fmt.Errorf("%w: %w\nrelay log:\n%s", errStopped, err, toolkit.Tail(r.log.String(), 30))
	}
	return nil
}

// passedThrough lists the caller's CDCRELAY_* variables the bench does not
// set itself, so a report says when the relay ran with non-default tuning.
func passedThrough(set map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		name, ok := strings.CutPrefix(k, "CDCRELAY_")
		if !ok || strings.HasPrefix(k, "CDCRELAY_TEST_") || name == "PG_BIN" || name == "RABBITMQ_BIN" {
			continue
		}
		if _, ours := set[name]; ours {
			continue
		}
		if strings.Contains(name, "URL") || strings.Contains(name, "KEY") {
			kv = k + "=<redacted>"
		}
		out = append(out, kv)
	}
	return out
}
