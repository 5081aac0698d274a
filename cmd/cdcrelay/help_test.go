package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestHelp: every way of asking for help exits 0 and prints, on stdout, the
// global usage or the usage of the command asked about, and nothing on
// stderr; none of them runs a command (no CDCRELAY_* variable is set here,
// so a command that ran would fail on its configuration).
func TestHelp(t *testing.T) {
	t.Setenv("CDCRELAY_DATABASE_URL", "")
	t.Setenv("CDCRELAY_AMQP_URL", "")
	global := []string{"usage: cdcrelay <command>", "run ", "migrate ", "check ", "tail ", "version ", "cdcrelay <command> -h"}
	perCommand := map[string][]string{
		"run":     {"usage: cdcrelay run\n", "publisher confirms", "CDCRELAY_DATABASE_URL", "/readyz", "SIGTERM"},
		"check":   {"usage: cdcrelay check\n", "one line per finding", "remedy", "Exits 1 on any ERROR"},
		"migrate": {"usage: cdcrelay migrate [-hot-marks]", "-hot-marks", "publication", "Idempotent"},
		"tail":    {"usage: cdcrelay tail", "-n", "-timeout"},
		"version": {"usage: cdcrelay version\n", "Prints the version"},
	}
	for _, args := range [][]string{{"help"}, {"-h"}, {"-help"}, {"--help"}} {
		out := runHelp(t, args)
		for _, want := range global {
			if !strings.Contains(out, want) {
				t.Errorf("cdcrelay %s: the usage lacks %q:\n%s", strings.Join(args, " "), want, out)
			}
		}
	}
	for command, wants := range perCommand {
		var outs []string
		for _, args := range [][]string{{command, "-h"}, {command, "--help"}, {command, "-help"}, {"help", command}} {
			out := runHelp(t, args)
			if strings.Contains(out, "usage: cdcrelay <command>") {
				t.Errorf("cdcrelay %s printed the global usage, not the usage of %s:\n%s", strings.Join(args, " "), command, out)
			}
			for _, want := range wants {
				if !strings.Contains(out, want) {
					t.Errorf("cdcrelay %s: the usage lacks %q:\n%s", strings.Join(args, " "), want, out)
				}
			}
			outs = append(outs, out)
		}
		for _, out := range outs[1:] {
			if out != outs[0] {
				t.Errorf("cdcrelay %s: the ways of asking for help print different texts:\n%s\n---\n%s", command, outs[0], out)
			}
		}
	}
}

// runHelp runs the dispatcher with args and fails the test unless it
// exited 0 with output on stdout only.
func runHelp(t *testing.T, args []string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(args, &stdout, &stderr); code != 0 || stderr.Len() > 0 || stdout.Len() == 0 {
		t.Fatalf("cdcrelay %s: exit %d, stdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// TestUsageErrors: no command, an unknown one, or arguments to a command
// that takes none exit 2 with the usage on stderr; an unknown command asked
// about is an error too, not help.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "usage: cdcrelay <command>"},
		{[]string{"--version"}, `unknown command "--version"`},
		{[]string{"frobnicate", "-h"}, `unknown command "frobnicate"`},
		{[]string{"help", "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"check", "now"}, "cdcrelay check takes no arguments"},
		{[]string{"run", "--verbose"}, "usage: cdcrelay run"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if code != 2 || stdout.Len() > 0 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("cdcrelay %s: exit %d, stdout %q, stderr:\n%s\nwant exit 2 and %q on stderr", strings.Join(tc.args, " "), code, stdout.String(), stderr.String(), tc.want)
		}
	}
}
