package main

import (
	"context"
	"fmt"
	"io"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/preflight"
)

// check runs the preflight against the configured database and broker,
// prints one line per finding on stdout and fails when any is an error.
// It reads the same CDCRELAY_* variables as run; a missing broker URL is a
// finding, not a configuration error, so the database checks still run.
func check(ctx context.Context, stdout, _ io.Writer) error {
	cfg, err := config.Load(ctx)
	if err != nil {
		return fmt.Errorf("configuration:\n%w", err)
	}
	if n := preflight.Write(stdout, preflight.Run(ctx, cfg, preflight.Options{})); n > 0 {
		return fmt.Errorf("check: %d error(s); see the remedies above", n)
	}
	return nil
}
