package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/svckit"
	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

// relayProc is a running `cdcrelay run` and its log.
type relayProc struct {
	*toolkit.Proc
	log *svckit.Buffer
}

// startRelay starts `bin run` with env. Its log (LOG_LEVEL=warn, so
// normally empty) is kept and shown if the bench fails.
func startRelay(bin string, env []string) (*relayProc, error) {
	log := &svckit.Buffer{}
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

// launch starts the relay with vars (its CDCRELAY_* settings, normally
// b.relayVars) and keeps it for its log; it does not wait.
func (b *bench) launch(vars map[string]string) (*relayProc, error) {
	rp, err := startRelay(b.opts.relay, toolkit.Env(vars))
	if err != nil {
		return nil, err
	}
	b.relays = append(b.relays, rp)
	return rp, nil
}

// startRelay starts the relay with vars and waits until it streams from
// the slot.
func (b *bench) startRelay(ctx context.Context, vars map[string]string) (*relayProc, error) {
	rp, err := b.launch(vars)
	if err != nil {
		return nil, err
	}
	if err := b.waitSlot(ctx, true, rp.Exited()); err != nil {
		_ = rp.stop(ctx)
		return nil, errors.Join(err, rp.exitError())
	}
	return rp, nil
}

// stopRelay stops the relay gracefully and waits until the slot is free.
func (b *bench) stopRelay(ctx context.Context, rp *relayProc) error {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := rp.stop(sctx); err != nil {
		return err
	}
	return b.waitSlot(ctx, false, nil)
}

// waitSlot waits until the bench slot is (or is no longer) active.
func (b *bench) waitSlot(ctx context.Context, active bool, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		// Streaming means the slot is active and its adoption marker is
		// gone: a relay stopped before that would redo the adoption at its
		// next start and publish the next backlog from the snapshot
		// instead of the stream.
		var is bool
		err := b.slotConn().QueryRow(ctx, `SELECT coalesce(bool_or(active) FILTER (WHERE slot_name = $1), false)
			AND NOT coalesce(bool_or(slot_name = $2), false) FROM pg_replication_slots`, benchSlot, config.AdoptionMarkerName(benchSlot)).Scan(&is)
		if err != nil {
			return fmt.Errorf("wait for slot %s active=%t: %w", benchSlot, active, err)
		}
		if is == active {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("slot %s not active=%t after 30s", benchSlot, active)
		case <-exited:
			return errStopped
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// slotConn is a superuser connection to the server that holds the slot.
func (b *bench) slotConn() *pgx.Conn {
	if b.slotDB != nil {
		return b.slotDB
	}
	return b.db
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
