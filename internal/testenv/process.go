package testenv

import (
	"os/exec"
	"testing"
	"time"
)

// Process is a program under test running as a child process, its output
// collected. The test's cleanup kills it and, if the test failed, logs the
// last lines of its output.
type Process struct {
	Cmd  *exec.Cmd
	Log  *Buffer
	done chan error // holds the exit error once the process ended
}

// StartProcess starts path with args and env (appended to nothing: pass
// os.Environ() to inherit).
func StartProcess(tb testing.TB, path string, env []string, args ...string) *Process {
	tb.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = env
	p := &Process{Cmd: cmd, Log: &Buffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.Log, p.Log
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		err := <-p.done
		p.done <- err
		if tb.Failed() {
			tb.Logf("%s log (last 60 lines):\n%s", path, Tail(p.Log.String(), 60))
		}
	})
	return p
}

// Wait returns the exit error once the process ends, failing the test if
// it runs longer than within.
func (p *Process) Wait(tb testing.TB, within time.Duration) error {
	tb.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(within):
		tb.Fatalf("%s still running after %s", p.Cmd.Path, within)
		return nil
	}
}

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case err := <-p.done:
		p.done <- err
		return true, err
	default:
		return false, nil
	}
}
