package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/svckit"
)

// PGBinEnv overrides the directory holding initdb, pg_ctl and postgres.
const PGBinEnv = "CDCRELAY_PG_BIN"

// pgBinGlob is where Debian/Ubuntu packages install the server binaries, one
// directory per major version.
const pgBinGlob = "/usr/lib/postgresql/*/bin"

// serverLogName is the file pg_ctl redirects the postmaster's output to.
const serverLogName = "server.log"

// settingsFileName holds the settings this package manages. It is included
// from postgresql.conf so it can be rewritten (for a new port) without
// touching the file initdb produced.
const settingsFileName = "cdcrelay.conf"

// PostgresOptions tunes a throwaway cluster.
type PostgresOptions struct {
	// Settings are extra postgresql.conf settings, e.g.
	// "wal_sender_timeout": "5s" or "max_slot_wal_keep_size": "64MB".
	// They override the defaults this package applies.
	Settings map[string]string
	// Log, when not nil, receives a copy of the server log if startup fails.
	Log io.Writer
}

// Postgres is a throwaway PostgreSQL cluster owned by the caller. Its methods
// are not safe for concurrent use with each other (Stop/Start/Close), but URL,
// Port, DataDir and ServerLog may be called from any goroutine.
type Postgres struct {
	binDir  string
	baseDir string // removed by Close; holds dataDir
	dataDir string
	port    int
	cred    *syscall.Credential // non-nil when we must drop root privileges
	// settings are the extra settings the cluster was started with; a
	// standby made from it (StartStandby) starts with them too.
	settings map[string]string
}

// StartPostgres initialises a new cluster in a temporary directory, starts it
// on a free 127.0.0.1 port with wal_level=logical and returns once it accepts
// connections. The caller must Close it.
func StartPostgres(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	binDir, err := findPGBinDir()
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	baseDir, err := makeBaseDir(cred)
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	p := &Postgres{
		binDir:  binDir,
		baseDir: baseDir,
		dataDir: filepath.Join(baseDir, "data"),
		cred:    cred,
	}
	if err := p.initAndStart(ctx, opts.Settings); err != nil {
		if opts.Log != nil {
			fmt.Fprintf(opts.Log, "--- postgres server log (%s) ---\n%s--- end of server log ---\n", p.logPath(), p.ServerLog())
		}
		_ = p.Close()
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	return p, nil
}

func (p *Postgres) initAndStart(ctx context.Context, settings map[string]string) error {
	if err := p.initdb(ctx); err != nil {
		return err
	}
	if err := p.includeSettingsFile(); err != nil {
		return err
	}
	return p.startOnFreePort(ctx, settings)
}

// startOnFreePort writes the settings file for a free port and starts the
// server there, picking another port when someone else took the first.
func (p *Postgres) startOnFreePort(ctx context.Context, settings map[string]string) error {
	p.settings = settings
	var lastErr error
	for range svckit.PortAttempts {
		port, err := svckit.FreePort()
		if err != nil {
			return err
		}
		p.port = port
		if err := p.writeSettings(settings); err != nil {
			return err
		}
		logBefore := len(p.ServerLog())
		lastErr = p.start(ctx)
		if lastErr == nil {
			return nil
		}
		if !isPortClash(p.ServerLog()[logBefore:]) || ctx.Err() != nil {
			return lastErr
		}
	}
	return fmt.Errorf("no free port after %d attempts: %w", svckit.PortAttempts, lastErr)
}

// URL returns a connection URL for database as the superuser "postgres".
func (p *Postgres) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.port, database)
}

// Port is the TCP port the cluster listens on (stable across restarts).
func (p *Postgres) Port() int { return p.port }

// BinDir is the directory of the server binaries the cluster runs
// (initdb, pg_ctl, postgres and their tools, such as pg_recvlogical).
func (p *Postgres) BinDir() string { return p.binDir }

// DataDir is the cluster's data directory (PGDATA). The unix socket and
// server.log live here too.
func (p *Postgres) DataDir() string { return p.dataDir }

// CreateDatabase creates database name, owned by postgres.
func (p *Postgres) CreateDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return fmt.Errorf("create database %q: connect: %w", name, err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create database %q: %w", name, err)
	}
	return nil
}

// Stop stops the server with pg_ctl's shutdown mode "smart", "fast" or
// "immediate" (empty means fast) and waits until it is down. "immediate" is a
// crash as far as the server is concerned: the next Start runs recovery.
func (p *Postgres) Stop(ctx context.Context, mode string) error {
	if mode == "" {
		mode = "fast"
	}
	if !slices.Contains([]string{"smart", "fast", "immediate"}, mode) {
		return fmt.Errorf("stop postgres: unknown shutdown mode %q (want smart, fast or immediate)", mode)
	}
	if _, err := p.pgctl(ctx, "stop", "-m", mode); err != nil {
		return fmt.Errorf("stop postgres (-m %s): %w", mode, err)
	}
	return nil
}

// Start starts a stopped server on the same port and waits until it accepts
// connections.
func (p *Postgres) Start(ctx context.Context) error {
	if err := p.start(ctx); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	return nil
}

func (p *Postgres) start(ctx context.Context) error {
	if _, err := p.pgctl(ctx, "start", "-l", p.logPath()); err != nil {
		return fmt.Errorf("on port %d: %w\nserver log tail:\n%s", p.port, err, svckit.Tail(p.ServerLog(), 20))
	}
	return nil
}

// Restart stops the server with mode and starts it again.
func (p *Postgres) Restart(ctx context.Context, mode string) error {
	if err := p.Stop(ctx, mode); err != nil {
		return fmt.Errorf("restart postgres: %w", err)
	}
	if err := p.Start(ctx); err != nil {
		return fmt.Errorf("restart postgres: %w", err)
	}
	return nil
}

// ServerLog returns the server log so far ("" if there is none yet).
func (p *Postgres) ServerLog() string {
	b, err := os.ReadFile(p.logPath())
	if err != nil {
		return ""
	}
	return string(b)
}

// Close stops the server immediately (if it is running) and removes the
// cluster's directory. It is safe to call more than once.
func (p *Postgres) Close() error {
	var errs []error
	if _, err := os.Stat(filepath.Join(p.dataDir, "postmaster.pid")); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := p.Stop(ctx, "immediate")
		cancel()
		// A stale pid file (the server was killed) is as good as stopped.
		if err != nil && !strings.Contains(err.Error(), "Is server running?") && !strings.Contains(err.Error(), "No such process") {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(p.baseDir); err != nil {
		errs = append(errs, fmt.Errorf("remove postgres dir: %w", err))
	}
	return errors.Join(errs...)
}

func (p *Postgres) logPath() string { return filepath.Join(p.dataDir, serverLogName) }

func (p *Postgres) initdb(ctx context.Context) error {
	major, err := p.Major()
	if err != nil {
		return err
	}
	// --locale=C keeps the cluster independent of whatever locales the host
	// has installed, and keeps server messages in English for isPortClash.
	args := []string{"-D", p.dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"}
	if major >= 14 { // initdb of 13 refuses --no-instructions
		args = append(args, "--no-instructions")
	}
	_, err = p.run(ctx, "initdb", "initdb", args...)
	return err
}

func (p *Postgres) includeSettingsFile() error {
	conf := filepath.Join(p.dataDir, "postgresql.conf")
	f, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open postgresql.conf: %w", err)
	}
	_, werr := fmt.Fprintf(f, "\ninclude '%s'\n", settingsFileName)
	if err := errors.Join(werr, f.Close()); err != nil {
		return fmt.Errorf("append include to postgresql.conf: %w", err)
	}
	return nil
}

// writeSettings (re)writes the included settings file for the current port.
func (p *Postgres) writeSettings(extra map[string]string) error {
	var b strings.Builder
	b.WriteString("# written by cdcrelay internal/svckit/pgcluster\n")
	for _, kv := range baseSettings(p.port, p.dataDir) {
		fmt.Fprintf(&b, "%s = %s\n", kv[0], quoteSetting(kv[1]))
	}
	// Extra settings come last so they win over the defaults above.
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = %s\n", k, quoteSetting(extra[k]))
	}
	path := filepath.Join(p.dataDir, settingsFileName)
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", settingsFileName, err)
	}
	if p.cred != nil {
		if err := os.Chown(path, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			return fmt.Errorf("chown %s: %w", settingsFileName, err)
		}
	}
	return nil
}

// baseSettings are applied to every cluster. They favour start-up and test
// speed (no fsync, no full-page writes) over durability, which a throwaway
// cluster does not need; synchronous_commit keeps its default so commit
// behaviour matches production.
func baseSettings(port int, dataDir string) [][2]string {
	return [][2]string{
		{"port", strconv.Itoa(port)},
		{"listen_addresses", "127.0.0.1"},
		{"unix_socket_directories", dataDir},
		{"wal_level", "logical"},
		{"max_wal_senders", "20"},
		{"max_replication_slots", "20"},
		{"fsync", "off"},
		{"full_page_writes", "off"},
		{"shared_buffers", "64MB"},
		{"logging_collector", "off"},
		{"log_min_messages", "warning"},
		{"log_line_prefix", "%m [%p] %q%u@%d "},
	}
}

// quoteSetting quotes any value as a postgresql.conf string literal, which
// the server accepts for numeric, boolean and enum settings too.
func quoteSetting(v string) string {
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

func (p *Postgres) pgctl(ctx context.Context, args ...string) (string, error) {
	// -w waits for the operation to finish; -t bounds that wait so a wedged
	// server turns into an error rather than a hung test.
	full := append([]string{args[0], "-D", p.dataDir, "-w", "-t", "60"}, args[1:]...)
	return p.run(ctx, "pg_ctl "+args[0], "pg_ctl", full...)
}

// run executes a server binary, as the postgres OS user when we are root, and
// returns its combined output. Errors carry the tail of that output.
func (p *Postgres) run(ctx context.Context, what, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(p.binDir, name), args...)
	// The caller's working directory (e.g. under /root) may be unreadable for
	// the postgres user, which makes initdb and pg_ctl complain.
	cmd.Dir = p.baseDir
	cmd.Env = serverEnv()
	if p.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	// pg_ctl start leaves the postmaster running with its own session and
	// output redirected to server.log, so Wait does not block on it.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s: %w\noutput:\n%s", what, err, svckit.Tail(out.String(), 20))
	}
	return out.String(), nil
}

// serverEnv drops PG* variables (PGDATA, PGPORT, ...) that would silently
// redirect pg_ctl, and pins the message language.
func serverEnv() []string {
	env := make([]string, 0, len(os.Environ())+1)
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_ALL=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

// findPGBinDir returns $CDCRELAY_PG_BIN or the highest-versioned
// /usr/lib/postgresql/*/bin that has the server binaries.
func findPGBinDir() (string, error) {
	if dir := os.Getenv(PGBinEnv); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err != nil {
			return "", fmt.Errorf("%s=%s has no pg_ctl: %w", PGBinEnv, dir, err)
		}
		return dir, nil
	}
	dirs, err := filepath.Glob(pgBinGlob)
	if err != nil {
		return "", fmt.Errorf("find postgres binaries: %w", err)
	}
	var usable []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "pg_ctl")); err == nil {
			usable = append(usable, d)
		}
	}
	if len(usable) == 0 {
		return "", fmt.Errorf("no PostgreSQL server binaries in %s (install postgresql, or set %s to the directory holding initdb and pg_ctl)", pgBinGlob, PGBinEnv)
	}
	sort.Slice(usable, func(i, j int) bool {
		return versionLess(filepath.Base(filepath.Dir(usable[i])), filepath.Base(filepath.Dir(usable[j])))
	})
	return usable[len(usable)-1], nil
}

// versionLess compares dotted numeric versions ("9.6" < "15"), so that the
// highest major version wins rather than the lexically last one.
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		ai, aerr := strconv.Atoi(as[i])
		bi, berr := strconv.Atoi(bs[i])
		if aerr != nil || berr != nil {
			return a < b
		}
		if ai != bi {
			return ai < bi
		}
	}
	return len(as) < len(bs)
}

// serverCredential returns the postgres OS user's credentials when we run as
// root (the server refuses to run as root), or nil otherwise.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL refuses to run as root, but there is no 'postgres' OS user to run it as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres user uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("postgres user gid %q: %w", u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// makeBaseDir creates the directory that will hold the data directory. As
// root it goes under /tmp (whose parents the postgres user can traverse,
// unlike a TMPDIR under /root), mode 0755 and owned by postgres so initdb can
// create the data directory inside it.
func makeBaseDir(cred *syscall.Credential) (string, error) {
	parent := os.TempDir()
	// A unix socket path must fit in ~107 bytes; long TMPDIRs (macOS) do not
	// leave room for "<dir>/data/.s.PGSQL.NNNNN".
	if cred != nil || len(parent) > 60 {
		parent = "/tmp"
	}
	dir, err := os.MkdirTemp(parent, "cdcrelay-pg-")
	if err != nil {
		return "", fmt.Errorf("create cluster dir: %w", err)
	}
	if cred == nil {
		return dir, nil
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", errors.Join(fmt.Errorf("chmod cluster dir: %w", err), os.RemoveAll(dir))
	}
	if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
		return "", errors.Join(fmt.Errorf("chown cluster dir to postgres: %w", err), os.RemoveAll(dir))
	}
	return dir, nil
}

func isPortClash(serverLog string) bool {
	return strings.Contains(serverLog, "Address already in use") ||
		strings.Contains(serverLog, "could not bind IPv4 address")
}
