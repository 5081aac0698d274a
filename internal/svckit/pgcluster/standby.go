package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/svckit"
)

// standbyWait bounds each wait of this file (streaming, replay, promotion,
// death) when the caller's context has no earlier deadline, so that a
// wedged server fails the test instead of hanging it.
const standbyWait = 2 * time.Minute

// primaryOnlySettings are the primary's settings a standby does not inherit.
var primaryOnlySettings = []string{"synchronous_standby_names", "synchronized_standby_slots"}

// StandbyOptions tunes a physical standby made by StartStandby.
type StandbyOptions struct {
	// Settings are extra postgresql.conf settings of the standby, e.g.
	// "sync_replication_slots": "on". They override the primary's settings
	// and the standby's own defaults.
	Settings map[string]string
	// Slot is the physical replication slot on the primary; "" means
	// "standby1".
	Slot string
	// Name is the application_name in primary_conninfo (what
	// pg_stat_replication and synchronous_standby_names see); "" means Slot.
	Name string
}

// StartStandby makes a physical streaming standby of p, which must be
// running, and returns it started and streaming. The caller must Close it.
//
// It needs no pg_basebackup (the binaries of the version matrix lack it, and
// Debian's 15 refuses newer servers): p is checkpointed and stopped (fast),
// its data directory copied, and p started again, so p's clients lose their
// connections once. The copy keeps none of p's replication slots, gets its
// own port, standby.signal, primary_conninfo and primary_slot_name, and
// starts with p's extra settings (but synchronous_standby_names and
// synchronized_standby_slots), hot_standby_feedback=on and opts.Settings.
func (p *Postgres) StartStandby(ctx context.Context, opts StandbyOptions) (*Postgres, error) {
	slot, name := opts.Slot, opts.Name
	if slot == "" {
		slot = "standby1"
	}
	if name == "" {
		name = slot
	}
	if err := p.execSQL(ctx, "CHECKPOINT"); err != nil {
		return nil, fmt.Errorf("start standby: %w", err)
	}
	if err := p.Stop(ctx, "fast"); err != nil {
		return nil, fmt.Errorf("start standby: %w", err)
	}
	s, copyErr := p.copyForStandby(ctx)
	if err := p.Start(ctx); err != nil {
		if s != nil {
			_ = s.Close()
		}
		return nil, fmt.Errorf("start standby: restart the primary: %w", errors.Join(copyErr, err))
	}
	if copyErr != nil {
		if s != nil {
			_ = s.Close()
		}
		return nil, fmt.Errorf("start standby: %w", copyErr)
	}
	if err := p.execSQL(ctx, "SELECT pg_create_physical_replication_slot($1, true)", slot); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("start standby: create slot %s on the primary: %w", slot, err)
	}
	settings := maps.Clone(p.settings)
	if settings == nil {
		settings = map[string]string{}
	}
	// These name the primary's standbys; a promoted standby that kept them
	// would wait for standbys it does not have.
	for _, k := range primaryOnlySettings {
		delete(settings, k)
	}
	settings["primary_conninfo"] = fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres application_name=%s", p.port, name)
	settings["primary_slot_name"] = slot
	settings["hot_standby_feedback"] = "on"
	maps.Copy(settings, opts.Settings)
	if err := s.startOnFreePort(ctx, settings); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("start standby: %w", err)
	}
	err := waitFor(ctx, "standby "+name+" streaming from the primary", func(ctx context.Context) (bool, error) {
		var n int
		err := p.queryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'", []any{name}, &n)
		return n > 0, err
	})
	if err != nil {
		err = fmt.Errorf("start standby: %w\nstandby log tail:\n%s", err, svckit.Tail(s.ServerLog(), 20))
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// copyForStandby copies p's data directory, p being stopped, into a new base
// directory, without p's slots, pid file and log, and marks it a standby.
func (p *Postgres) copyForStandby(ctx context.Context) (*Postgres, error) {
	baseDir, err := makeBaseDir(p.cred)
	if err != nil {
		return nil, err
	}
	s := &Postgres{binDir: p.binDir, baseDir: baseDir, dataDir: filepath.Join(baseDir, "data"), cred: p.cred}
	// cp -a keeps the owner (postgres) and the data directory's mode 0700.
	if out, err := exec.CommandContext(ctx, "cp", "-a", p.dataDir, s.dataDir).CombinedOutput(); err != nil {
		return s, fmt.Errorf("copy the primary's data directory: %w: %s", err, out)
	}
	slots, err := filepath.Glob(filepath.Join(s.dataDir, "pg_replslot", "*"))
	if err != nil {
		return s, err
	}
	for _, f := range append(slots, filepath.Join(s.dataDir, "postmaster.pid"), s.logPath()) {
		if err := os.RemoveAll(f); err != nil {
			return s, err
		}
	}
	signal := filepath.Join(s.dataDir, "standby.signal")
	if err := os.WriteFile(signal, nil, 0o600); err != nil {
		return s, fmt.Errorf("write standby.signal: %w", err)
	}
	if s.cred != nil {
		if err := os.Chown(signal, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return s, fmt.Errorf("chown standby.signal: %w", err)
		}
	}
	if err := os.Chmod(s.dataDir, 0o700); err != nil {
		return s, fmt.Errorf("chmod the standby's data directory: %w", err)
	}
	return s, nil
}

// Promote runs pg_ctl promote on a standby and waits until it has left
// recovery (pg_is_in_recovery() is false), i.e. accepts writes.
func (p *Postgres) Promote(ctx context.Context) error {
	if _, err := p.pgctl(ctx, "promote"); err != nil {
		return fmt.Errorf("promote: %w", err)
	}
	err := waitFor(ctx, "the promoted server to leave recovery", func(ctx context.Context) (bool, error) {
		var inRecovery bool
		err := p.queryRow(ctx, "SELECT pg_is_in_recovery()", nil, &inRecovery)
		return err == nil && !inRecovery, err
	})
	if err != nil {
		return fmt.Errorf("promote: %w", err)
	}
	return nil
}

// WaitReplayed waits until standby s has replayed at least lsn
// (pg_last_wal_replay_lsn()).
func (s *Postgres) WaitReplayed(ctx context.Context, lsn pglogrepl.LSN) error {
	var got *pglogrepl.LSN
	err := waitFor(ctx, "the standby to replay "+lsn.String(), func(ctx context.Context) (bool, error) {
		err := s.queryRow(ctx, "SELECT pg_last_wal_replay_lsn()", nil, &got)
		return err == nil && got != nil && *got >= lsn, err
	})
	if err != nil && got != nil {
		return fmt.Errorf("wait replayed: %w (replayed %s)", err, *got)
	}
	if err != nil {
		return fmt.Errorf("wait replayed: %w", err)
	}
	return nil
}

// CurrentLSN returns pg_current_wal_lsn() of a primary: what a standby must
// replay to have everything committed so far.
func (p *Postgres) CurrentLSN(ctx context.Context) (pglogrepl.LSN, error) {
	var lsn pglogrepl.LSN
	if err := p.queryRow(ctx, "SELECT pg_current_wal_lsn()", nil, &lsn); err != nil {
		return 0, fmt.Errorf("current lsn: %w", err)
	}
	return lsn, nil
}

// Kill SIGKILLs the postmaster and every process of the cluster, as a machine
// that dies would: no shutdown checkpoint, no goodbye from the walsenders to
// their standbys or relays. It waits until the port refuses connections and
// removes the stale postmaster.pid (and the shared memory it names), so
// Start (which then runs crash recovery) and Close still work.
func (p *Postgres) Kill(ctx context.Context) error {
	pidFile := filepath.Join(p.dataDir, "postmaster.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return fmt.Errorf("kill postgres: is it running? %w", err)
	}
	lines := strings.Split(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil || pid <= 0 {
		return fmt.Errorf("kill postgres: bad pid in %s: %q", pidFile, lines[0])
	}
	// A pid file left by a crash may name a pid the system reused since.
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && !strings.Contains(string(cmdline), p.dataDir) {
		return fmt.Errorf("kill postgres: pid %d of %s is not this cluster's postmaster (stale pid file?)", pid, pidFile)
	}
	// A stopped postmaster neither forks nor reacts to its children's deaths,
	// so the list of children stays complete until they all die at once.
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("kill postgres: stop postmaster %d: %w", pid, err)
	}
	pids := append(svckit.Children(pid), pid)
	for _, c := range pids {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
	err = waitFor(ctx, "the killed cluster's processes to exit and its port to close", func(context.Context) (bool, error) {
		for _, c := range pids {
			if svckit.Alive(c) {
				return false, nil
			}
		}
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = conn.Close()
			return false, nil
		}
		return errors.Is(err, syscall.ECONNREFUSED), nil
	})
	if err != nil {
		return fmt.Errorf("kill postgres: %w", err)
	}
	// Line 7 holds the SysV shared memory key and id; only a clean exit
	// removes that segment. Best effort: the server does not need it gone.
	if len(lines) > 6 {
		if f := strings.Fields(lines[6]); len(f) == 2 {
			_ = exec.Command("ipcrm", "-m", f[1]).Run()
		}
	}
	lock := filepath.Join(p.dataDir, fmt.Sprintf(".s.PGSQL.%d.lock", p.port))
	for _, f := range []string{pidFile, lock} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("kill postgres: %w", err)
		}
	}
	return nil
}

// execSQL runs one statement on database postgres.
func (p *Postgres) execSQL(ctx context.Context, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// queryRow runs one query on database postgres and scans its row.
func (p *Postgres) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// waitFor polls check until it reports done, ctx ends or standbyWait passes.
// An error from check only ends the wait with the deadline (a server may
// refuse connections for a moment); the last one is reported then.
func waitFor(ctx context.Context, what string, check func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, standbyWait)
	defer cancel()
	var lastErr error
	for {
		done, err := check(ctx)
		if done {
			return nil
		}
		if err != nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return fmt.Errorf("waiting for %s: %w (last error: %w)", what, ctx.Err(), lastErr)
			}
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// majors caches the major version of each bin dir's postgres.
var majors sync.Map // bin dir -> int

// Major returns the cluster's PostgreSQL major version (15 for 15.20).
func (p *Postgres) Major() (int, error) { return binMajor(p.binDir) }

// PGMajor returns the major version of the server binaries a new cluster
// (StartPostgres) would use: $CDCRELAY_PG_BIN or Debian's newest. Tests of
// features a version lacks ask it.
func PGMajor() (int, error) {
	dir, err := findPGBinDir()
	if err != nil {
		return 0, err
	}
	return binMajor(dir)
}

func binMajor(binDir string) (int, error) {
	if m, ok := majors.Load(binDir); ok {
		return m.(int), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// postgres --version runs as root too, and outside any data directory.
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "postgres"), "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("postgres --version in %s: %w", binDir, err)
	}
	m, err := parseMajor(string(out))
	if err != nil {
		return 0, fmt.Errorf("postgres --version in %s: %w", binDir, err)
	}
	majors.Store(binDir, m)
	return m, nil
}

// parseMajor reads the major version from postgres --version's output,
// "postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)" or "... 18beta1".
func parseMajor(version string) (int, error) {
	f := strings.Fields(version)
	if len(f) < 3 {
		return 0, fmt.Errorf("unexpected version %q", strings.TrimSpace(version))
	}
	digits := f[2]
	if i := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		digits = digits[:i]
	}
	m, err := strconv.Atoi(digits)
	if err != nil || m < 10 {
		return 0, fmt.Errorf("unexpected version %q", strings.TrimSpace(version))
	}
	return m, nil
}
