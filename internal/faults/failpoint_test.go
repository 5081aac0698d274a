//go:build faults

package faults_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/failpoint"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// These tests kill the relay at an exact point of its code with a
// failpoint (internal/failpoint): the binary is built with -tags
// failpoints and CDCRELAY_FAILPOINT names the point.

// TestIntegrationFailpointKillAfterPublish: SIGKILL right after the 1500th publish,
// before its confirm is processed.
func TestIntegrationFailpointKillAfterPublish(t *testing.T) {
	w := newWorld(t, worldOptions{})
	p := w.startProcess(processOptions{Race: true, Tags: "failpoints",
		Env: []string{failpoint.Env + "=" + failpoint.AfterPublish + "@1500"}})
	testenv.WaitSlotActive(t, w.db, slotName, 30*time.Second)
	all := w.insert(t, 200, 10)
	p.waitFailpoint(t, failpoint.AfterPublish)
	slotAtKill := testenv.ConfirmedFlush(t, w.db, slotName)

	restarted := time.Now()
	w.startProcess(processOptions{Race: true})
	w.waitAll(t, time.Minute)
	killedAt := w.commitLSN(t, all[1499])
	testenv.WaitConfirmed(t, w.db, slotName, killedAt+1, time.Minute)
	recovery := time.Since(restarted)
	if slotAtKill > killedAt {
		t.Fatalf("slot at %s when killed, past the transaction of the event being published (commit %s)", slotAtKill, killedAt)
	}
	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	w.checkRecovered(t, "relay SIGKILL at failpoint "+failpoint.AfterPublish+"@1500", recovery,
		fmt.Sprintf("slot at kill %s, the event's commit %s; recovery = new process start until the slot passed it", slotAtKill, killedAt))
}

// TestIntegrationFailpointKillBeforeStatus: SIGKILL after the watermark moved past
// confirmed events, before the status update that reports it, at the 10th
// such update under a steady load.
func TestIntegrationFailpointKillBeforeStatus(t *testing.T) {
	w := newWorld(t, worldOptions{})
	p := w.startProcess(processOptions{Race: true, Tags: "failpoints",
		Env: []string{failpoint.Env + "=" + failpoint.BeforeStatus + "@10"}})
	testenv.WaitSlotActive(t, w.db, slotName, 30*time.Second)
	l := w.load(3000, 1000, 10)
	p.waitFailpoint(t, failpoint.BeforeStatus)
	killed := time.Now()
	delivered := w.consumer.Count()

	w.startProcess(processOptions{Race: true})
	l.wait(t, time.Minute)
	w.waitAll(t, time.Minute)
	w.check(t, "relay SIGKILL at failpoint "+failpoint.BeforeStatus+"@10 under load", killed, l.since(killed),
		fmt.Sprintf("killed after %d deliveries; recovery = worst commit-to-delivery latency of events committed after the kill", delivered))
}

// waitFailpoint waits until the process has killed itself at name.
func (p *process) waitFailpoint(t *testing.T, name string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if done, err := p.Exited(); done {
			if !killed(err) {
				t.Fatalf("relay exited with %v before failpoint %s", err, name)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("failpoint %s never fired within 60s: is failpoint.Hit(%q) wired into the relay's code? (internal/failpoint)", name, name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(p.Log.String(), "failpoint "+name+" hit") {
		t.Fatalf("relay died by SIGKILL but not at failpoint %s", name)
	}
}
