package main

// The standby part's PostgreSQL binaries. Logical decoding on a standby
// needs 16 or later, and the bench's own cluster is Debian's 15 unless
// CDCRELAY_PG_BIN says otherwise, so the part takes the newer binaries
// .ci/install-postgres caches for the version matrix.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/svckit/pgcluster"
	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

const (
	// minStandbyMajor is the first major version that decodes on a standby.
	minStandbyMajor = 16
	// preferredStandbyMajor is what the part takes from the cache when the
	// default binaries are too old: fixed rather than the newest, so that
	// runs on different days compare; 17 is the first with failover slots.
	preferredStandbyMajor = 17
	// installTimeout bounds .ci/install-postgres, which downloads the
	// binaries once per machine.
	installTimeout = 10 * time.Minute
)

// pgBuild is a major version and the directory of its server binaries;
// dir "" is the default binaries, the ones the main cluster uses.
type pgBuild struct {
	major int
	dir   string
}

// parseInstallPostgres reads the output of .ci/install-postgres, one
// "<major> <bin dir>" a line; other lines are skipped.
func parseInstallPostgres(out string) []pgBuild {
	var builds []pgBuild
	for _, line := range strings.Split(out, "\n") {
		major, dir, ok := strings.Cut(strings.TrimSpace(line), " ")
		m, err := strconv.Atoi(major)
		dir = strings.TrimSpace(dir)
		if !ok || err != nil || m < 10 || !filepath.IsAbs(dir) {
			continue
		}
		builds = append(builds, pgBuild{major: m, dir: dir})
	}
	return builds
}

// pickStandbyBuild chooses among cached builds: preferredStandbyMajor if
// there, else the newest that decodes on a standby.
func pickStandbyBuild(builds []pgBuild) (pgBuild, bool) {
	var best pgBuild
	for _, b := range builds {
		if b.major == preferredStandbyMajor {
			return b, true
		}
		if b.major >= minStandbyMajor && b.major > best.major {
			best = b
		}
	}
	return best, best.major != 0
}

// standbyBinaries says which binaries the standby part runs, or why it
// cannot run: -standby-pg-bin if given, else the default binaries if they
// are 16 or later, else the cache of .ci/install-postgres.
func standbyBinaries(ctx context.Context, opts options) (pgBuild, string) {
	if opts.standbyPGBin != "" {
		m, err := majorOf(opts.standbyPGBin)
		if err != nil {
			return pgBuild{}, fmt.Sprintf("-standby-pg-bin %s: %v", opts.standbyPGBin, err)
		}
		if m < minStandbyMajor {
			return pgBuild{}, fmt.Sprintf("-standby-pg-bin %s is PostgreSQL %d; decoding on a standby needs %d or later", opts.standbyPGBin, m, minStandbyMajor)
		}
		return pgBuild{major: m, dir: opts.standbyPGBin}, ""
	}
	def, err := pgcluster.PGMajor()
	if err == nil && def >= minStandbyMajor {
		return pgBuild{major: def}, ""
	}
	inUse := fmt.Sprintf("the default binaries are PostgreSQL %d", def)
	if err != nil {
		inUse = fmt.Sprintf("the default binaries' version is unknown (%v)", err)
	}
	say("standby part: %s, older than %d; asking .ci/install-postgres for the cached %d (a download the first time)", inUse, minStandbyMajor, preferredStandbyMajor)
	out, runErr := runInstallPostgres(ctx, opts.relay)
	if b, ok := pickStandbyBuild(parseInstallPostgres(out)); ok {
		return b, ""
	}
	why := fmt.Sprintf("%s, and .ci/install-postgres listed no PostgreSQL %d or later", inUse, minStandbyMajor)
	if runErr != nil {
		why += ": " + runErr.Error()
	}
	return pgBuild{}, why + fmt.Sprintf(" (pass -standby-pg-bin DIR or set %s to 16+ binaries)", pgcluster.PGBinEnv)
}

// runInstallPostgres runs .ci/install-postgres from the clone (the working
// directory, or the one above the relay binary's) and returns its output.
func runInstallPostgres(ctx context.Context, relay string) (string, error) {
	script := ""
	for _, c := range []string{filepath.Join(".ci", "install-postgres"), filepath.Join(filepath.Dir(relay), "..", ".ci", "install-postgres")} {
		if _, err := os.Stat(c); err == nil {
			script = c
			break
		}
	}
	if script == "" {
		return "", fmt.Errorf("no .ci/install-postgres here (run the bench from the clone)")
	}
	ctx, cancel := context.WithTimeout(ctx, installTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, script)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s: %w: %s", script, err, strings.TrimSpace(toolkit.Tail(stderr.String(), 3)))
	}
	return stdout.String(), nil
}

// majorOf is the major version of the server binaries in dir.
func majorOf(dir string) (int, error) {
	var m int
	err := withPGBin(dir, func() (err error) {
		m, err = pgcluster.PGMajor()
		return err
	})
	return m, err
}

// withPGBin runs fn with CDCRELAY_PG_BIN set to dir (pgcluster reads it when
// it makes a cluster) and restores it after; dir "" changes nothing.
func withPGBin(dir string, fn func() error) error {
	if dir == "" {
		return fn()
	}
	old, had := os.LookupEnv(pgcluster.PGBinEnv)
	if err := os.Setenv(pgcluster.PGBinEnv, dir); err != nil {
		return err
	}
	defer func() {
		if had {
			_ = os.Setenv(pgcluster.PGBinEnv, old)
		} else {
			_ = os.Unsetenv(pgcluster.PGBinEnv)
		}
	}()
	return fn()
}
