//go:build faults

package faults_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/failpoint"
	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// afterMark is the janitor's failpoint: a batch's mark UPDATE has
// committed; the done callbacks that tell the watermark its rows are
// marked have not run.
const afterMark = "janitor.after-mark"

// TestIntegrationFailpointKillAfterMark: SIGKILL between the janitor's
// committed UPDATE of a batch and the done callbacks of its rows, at the
// 3rd batch, while a backlog streams. The dead process's slot must not
// have passed any row left unmarked (the watermark moves only on done),
// and the restarted relay delivers every row, marks every row and moves
// the slot past them all.
func TestIntegrationFailpointKillAfterMark(t *testing.T) {
	if !slices.Contains(failpoint.Known, afterMark) {
		t.Fatalf("failpoint %s is not in failpoint.Known: CDCRELAY_FAILPOINT would refuse it", afterMark)
	}
	w := newWorld(t, worldOptions{})
	p := w.startProcess(processOptions{Race: true, Tags: "failpoints", Extra: map[string]string{"MARK_INTERVAL": "100ms"},
		Env: []string{failpoint.Env + "=" + afterMark + "@3"}})
	testenv.WaitSlotActive(t, w.db, slotName, 30*time.Second)
	all := w.insert(t, 200, 10)
	p.waitFailpoint(t, afterMark)
	slotAtKill := testenv.ConfirmedFlush(t, w.db, slotName)
	unmarked := w.unmarkedIDs(t)
	if len(unmarked) == 0 {
		t.Fatal("every row was marked when the relay was killed: the test would prove nothing")
	}

	restarted := time.Now()
	w.startProcess(processOptions{Race: true})
	w.waitAll(t, time.Minute)
	firstUnmarked := all[slices.IndexFunc(all, func(id string) bool { return unmarked[id] })]
	at := w.commitLSN(t, firstUnmarked)
	if slotAtKill > at {
		t.Fatalf("slot at %s when killed, past the transaction of row %s (commit %s), which was not marked", slotAtKill, firstUnmarked, at)
	}
	last := w.commitLSN(t, all[len(all)-1])
	testenv.WaitConfirmed(t, w.db, slotName, last+1, time.Minute)
	recovery := time.Since(restarted)
	waitFor(t, "every row marked by the restarted relay", time.Minute, func() bool { return len(w.unmarkedIDs(t)) == 0 })
	w.checkRecovered(t, "relay SIGKILL at failpoint "+afterMark+"@3", recovery,
		fmt.Sprintf("%d of %d rows unmarked at the kill, slot at %s, first unmarked row's commit %s; recovery = new process start until the slot passed every row",
			len(unmarked), len(all), slotAtKill, at))
}

// unmarkedIDs returns the ids of the outbox rows without published_at.
func (w *world) unmarkedIDs(t *testing.T) map[string]bool {
	t.Helper()
	rows, err := w.db.Query(context.Background(), `SELECT id::text FROM event_outbox WHERE published_at IS NULL`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
