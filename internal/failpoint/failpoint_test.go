package failpoint

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		spec string
		name string
		n    int
		bad  bool
	}{
		{spec: AfterPublish, name: AfterPublish, n: 1},
		{spec: BeforeStatus + "@1500", name: BeforeStatus, n: 1500},
		{spec: " " + AfterPublish + "@2 ", name: AfterPublish, n: 2},
		{spec: "nope", bad: true},
		{spec: AfterPublish + "@0", bad: true},
		{spec: AfterPublish + "@x", bad: true},
	} {
		name, n, err := parse(tc.spec)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), Env) {
				t.Errorf("parse(%q) = %q, %d, %v; want an error naming %s", tc.spec, name, n, err, Env)
			}
			continue
		}
		if err != nil || name != tc.name || n != tc.n {
			t.Errorf("parse(%q) = %q, %d, %v; want %q, %d", tc.spec, name, n, err, tc.name, tc.n)
		}
	}
}

// TestHit runs this test binary again with CDCRELAY_FAILPOINT set and
// checks that the child died by SIGKILL at the right hit (built with
// -tags failpoints) or ran to the end (built without).
func TestHit(t *testing.T) {
	if os.Getenv("FAILPOINT_CHILD") == "1" {
		for i := 1; i <= 5; i++ {
			Hit(BeforeStatus) // not the one named
			Hit(AfterPublish)
			_, _ = os.Stdout.WriteString("survived " + strconv.Itoa(i) + "\n")
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHit$")
	cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", Env+"="+AfterPublish+"@3")
	out, err := cmd.CombinedOutput()
	if !Enabled {
		if err != nil || !strings.Contains(string(out), "survived 5") {
			t.Fatalf("without the failpoints tag Hit must do nothing: %v\n%s", err, out)
		}
		return
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child: %v, want death by SIGKILL\n%s", err, out)
	}
	if !strings.Contains(string(out), "survived 2") || strings.Contains(string(out), "survived 3") ||
		!strings.Contains(string(out), "failpoint "+AfterPublish+" hit (time 3)") {
		t.Fatalf("child did not die at the third hit:\n%s", out)
	}
}
