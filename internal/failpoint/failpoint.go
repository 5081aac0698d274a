// Package failpoint lets the fault tests kill the relay process at an exact
// point of its pipeline, to check that no boundary loses an event.
//
// A failpoint is a call failpoint.Hit(name) in the relay's code. It does
// nothing unless the binary was built with the build tag `failpoints` and
// the environment variable CDCRELAY_FAILPOINT names it: then the process
// sends itself SIGKILL there, as a crash or an OOM kill would, after one
// line on stderr saying so. Production builds compile Hit to an empty
// function.
//
//	CDCRELAY_FAILPOINT=publish.after-publish       the first time it is reached
//	CDCRELAY_FAILPOINT=publish.after-publish@1500  the 1500th time
package failpoint

import (
	"fmt"
	"strconv"
	"strings"
)

// Env names the failpoint to trigger.
const Env = "CDCRELAY_FAILPOINT"

// The failpoints wired into the relay.
const (
	// AfterPublish: an event's message has been written to the broker;
	// its confirm has not been processed.
	AfterPublish = "publish.after-publish"
	// BeforeStatus: the ack watermark has moved past confirmed events; the
	// standby status update reporting the new position has not been sent.
	BeforeStatus = "wal.before-status"
	// AfterMark: the janitor's UPDATE marking a batch of rows published
	// has committed; the rows' done callbacks, which let the ack
	// watermark move past them, have not run.
	AfterMark = "janitor.after-mark"
)

// Known lists the failpoints, for validating CDCRELAY_FAILPOINT.
var Known = []string{AfterPublish, BeforeStatus, AfterMark}

// parse reads "name" or "name@n" (n >= 1).
func parse(spec string) (name string, n int, err error) {
	name, count, found := strings.Cut(strings.TrimSpace(spec), "@")
	n = 1
	if found {
		if n, err = strconv.Atoi(count); err != nil || n < 1 {
			return "", 0, fmt.Errorf("%s=%q: the count after @ must be a positive integer", Env, spec)
		}
	}
	for _, k := range Known {
		if name == k {
			return name, n, nil
		}
	}
	return "", 0, fmt.Errorf("%s=%q: unknown failpoint (known: %s)", Env, spec, strings.Join(Known, ", "))
}
