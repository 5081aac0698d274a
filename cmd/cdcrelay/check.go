package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

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
	fs := append(configFindings(os.Environ()), preflight.Run(ctx, cfg, preflight.Options{})...)
	if n := preflight.Write(stdout, fs); n > 0 {
		return fmt.Errorf("check: %d error(s); see the remedies above", n)
	}
	return nil
}

// configFindings reports the CDCRELAY_* variables run would warn about
// and ignore. run still starts with them, but for check, the deploy gate,
// they are an error: a misspelt variable leaves its setting at the
// default (CDCRELAY_EXCHANGES publishes to the default exchange), which a
// warning under an exit status of 0 lets through.
func configFindings(environ []string) []preflight.Finding {
	unknown := unknownVariables(environ)
	if len(unknown) == 0 {
		return []preflight.Finding{{Check: "configuration", Message: "every CDCRELAY_* variable set is one the relay reads"}}
	}
	names := make([]string, len(unknown))
	for i, u := range unknown {
		names[i] = u.String()
	}
	return []preflight.Finding{{Check: "configuration", Severity: preflight.Error,
		Message: "unknown variables, which run ignores (their settings stay at the default): " + strings.Join(names, ", "),
		Remedy:  "fix or remove them; docs/configuration.md lists every variable"}}
}
