package toolkit

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Proc is a running relay subcommand, usually `cdcrelay run`.
type Proc struct {
	cmd     *exec.Cmd
	started time.Time
	exited  chan struct{} // closed when the process has exited
	err     error         // exit error; read only after exited is closed
}

// Start starts `bin subcommand` with env, its stdout and stderr going to out.
// It is not tied to a context: the caller stops it with Stop, so the relay
// shuts down on SIGTERM the way it would in production. The relay runs in
// its own process group (see SysProcAttr). If out has a Flush method, it is
// called once the process has exited and before Exited is closed, so the
// relay's last log line is out before anyone reacts to its exit.
func Start(bin string, env []string, subcommand string, out io.Writer) (*Proc, error) {
	cmd := exec.Command(bin, subcommand)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = SysProcAttr()
	p := &Proc{cmd: cmd, exited: make(chan struct{})}
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s %s: %w", bin, subcommand, err)
	}
	go func() {
		p.err = cmd.Wait()
		if f, ok := out.(interface{ Flush() }); ok {
			f.Flush()
		}
		close(p.exited)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Started is when Start was called, just before the process was started.
func (p *Proc) Started() time.Time { return p.started }

// Exited is closed when the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Err is the process's exit error: nil while it runs or when it exited
// with status 0.
func (p *Proc) Err() error {
	select {
	case <-p.exited:
		return p.err
	default:
		return nil
	}
}

// Stop sends SIGTERM and waits for the process to exit, killing it if it
// does not stop before ctx ends. It reports only a failure to stop; how the
// process exited is Err.
func (p *Proc) Stop(ctx context.Context) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal relay: %w", err)
	}
	select {
	case <-p.exited:
		return nil
	case <-ctx.Done():
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("relay did not stop after SIGTERM, killed it: %w", ctx.Err())
	}
}

// Run runs `bin subcommand` with env to completion, its stdout and stderr
// going to out.
func Run(ctx context.Context, bin string, env []string, subcommand string, out io.Writer) error {
	cmd := exec.CommandContext(ctx, bin, subcommand)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", bin, subcommand, err)
	}
	return nil
}

// Env is the relay's environment: the caller's, with set's entries as
// CDCRELAY_<key>=<value>. The tool's own settings win over the same
// variables in the caller's environment; other CDCRELAY_* variables the
// caller sets (e.g. CDCRELAY_LOG_LEVEL or tuning) pass through.
func Env(set map[string]string) []string {
	env := make([]string, 0, len(os.Environ())+len(set))
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ours := set[strings.TrimPrefix(k, "CDCRELAY_")]; ours && strings.HasPrefix(k, "CDCRELAY_") {
			continue
		}
		env = append(env, kv)
	}
	for k, v := range set {
		env = append(env, "CDCRELAY_"+k+"="+v)
	}
	return env
}
