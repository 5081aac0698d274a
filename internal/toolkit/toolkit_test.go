package toolkit

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	tests := []struct {
		p    float64
		want time.Duration
	}{
		{0.50, 50 * time.Millisecond},
		{0.99, 99 * time.Millisecond},
		{1.00, 100 * time.Millisecond},
		{0.001, 1 * time.Millisecond},
		{0, 1 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := Percentile(d, tt.p); got != tt.want {
			t.Errorf("Percentile(1..100 ms, %v) = %v, want %v", tt.p, got, tt.want)
		}
	}
	if got := Percentile(nil, 0.5); got != 0 {
		t.Errorf("Percentile(nil) = %v", got)
	}
	if got := Percentile([]time.Duration{7}, 0.99); got != 7 {
		t.Errorf("percentile of one value = %v", got)
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 100000: "100,000", -1234567: "-1,234,567"} {
		if got := Thousands(n); got != want {
			t.Errorf("Thousands(%d) = %q, want %q", n, got, want)
		}
	}
	for d, want := range map[time.Duration]string{
		1234 * time.Microsecond: "1.23 ms", 46300 * time.Microsecond: "46.3 ms", 3812 * time.Millisecond: "3,812 ms",
	} {
		if got := Ms(d); got != want {
			t.Errorf("Ms(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestTail(t *testing.T) {
	for _, tt := range []struct {
		in   string
		n    int
		want string
	}{
		{"a\nb\nc\n", 2, "b\nc"},
		{"a\nb\nc", 5, "a\nb\nc"},
		{"", 3, ""},
	} {
		if got := Tail(tt.in, tt.n); got != tt.want {
			t.Errorf("Tail(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}

func TestEnv(t *testing.T) {
	t.Setenv("CDCRELAY_EXCHANGE", "theirs")
	t.Setenv("CDCRELAY_LOG_LEVEL", "debug")
	env := Env(map[string]string{"EXCHANGE": "ours", "SLOT": "s"})
	if slices.Contains(env, "CDCRELAY_EXCHANGE=theirs") || !slices.Contains(env, "CDCRELAY_EXCHANGE=ours") ||
		!slices.Contains(env, "CDCRELAY_SLOT=s") || !slices.Contains(env, "CDCRELAY_LOG_LEVEL=debug") {
		t.Fatalf("env %v", env)
	}
}

// flushBuffer records that Start flushed it.
type flushBuffer struct {
	testenv.Buffer
	flushed chan struct{}
}

func (f *flushBuffer) Flush() { close(f.flushed) }

func TestStopSendsSIGTERM(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatalf("need sleep(1): %v", err)
	}
	out := &flushBuffer{flushed: make(chan struct{})}
	p, err := Start(sleep, nil, "60", out)
	if err != nil {
		t.Fatal(err)
	}
	if p.Pid() <= 0 || p.Started().IsZero() {
		t.Fatalf("pid %d, started %v", p.Pid(), p.Started())
	}
	if err := p.Err(); err != nil {
		t.Fatalf("Err while running: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	select {
	case <-out.flushed:
	default:
		t.Fatal("Exited closed before the output was flushed")
	}
	var exit *exec.ExitError
	if !errors.As(p.Err(), &exit) || !strings.Contains(exit.String(), "terminated") {
		t.Fatalf("exit %v, want terminated by SIGTERM", p.Err())
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatalf("second stop: %v", err)
	}
}

func TestRun(t *testing.T) {
	echo, err := exec.LookPath("echo")
	if err != nil {
		t.Fatalf("need echo(1): %v", err)
	}
	var out bytes.Buffer
	if err := Run(context.Background(), echo, nil, "hello", &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != "hello\n" {
		t.Fatalf("output %q", out.String())
	}
	falseBin, err := exec.LookPath("false")
	if err != nil {
		t.Fatalf("need false(1): %v", err)
	}
	if err := Run(context.Background(), falseBin, nil, "x", &out); err == nil || !strings.Contains(err.Error(), "false x") {
		t.Fatalf("failing subcommand: %v", err)
	}
}
