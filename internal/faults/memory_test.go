//go:build faults

package faults_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// TestIntegrationBacklogMemoryBounded commits a 200,000-event backlog in one burst
// while the broker link is slow (a proxy passes 200 KB/s of publishes), so
// the backlog waits in the WAL, not in the relay. The relay's resident
// memory must stay bounded by its in-flight window whatever the backlog: its
// peak RSS (VmHWM) may not exceed its RSS before the backlog by more than
// the window's worth of memory. The binary is built without -race, whose
// shadow memory would swamp the figure.
func TestIntegrationBacklogMemoryBounded(t *testing.T) {
	const (
		backlog  = 200_000
		slowRate = 200 << 10 // bytes/s of publishes
		slowFor  = 20 * time.Second
		budget   = 32 << 10 // KiB the backlog may add to the relay's RSS
	)
	w := newWorld(t, worldOptions{})
	link := testenv.MustProxy(t, relaytest.BrokerHostPort(t, w.amqpURL))
	p := w.startProcess(processOptions{Extra: map[string]string{
		"AMQP_URL": "amqp://guest:guest@" + link.Addr() + "/", "LOG_LEVEL": "warn",
	}})
	pid := p.Cmd.Process.Pid
	testenv.WaitSlotActive(t, w.db, slotName, 30*time.Second)
	w.waitIDs(t, w.insert(t, 100, 10), time.Minute)
	testenv.WaitConfirmed(t, w.db, slotName, currentLSN(t, w.db), 30*time.Second)
	time.Sleep(2 * time.Second) // let the janitor and the runtime settle
	baseline, baselinePeak, err := testenv.Memory(pid)
	if err != nil {
		t.Fatal(err)
	}

	// Sample memory and the in-flight gauge all along.
	var (
		mu          sync.Mutex
		maxRSS      int64
		maxInFlight float64
	)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			rss, _, err := testenv.Memory(pid)
			m, merr := p.metrics("cdcrelay_confirms_in_flight")
			mu.Lock()
			if err == nil {
				maxRSS = max(maxRSS, rss)
			}
			if merr == nil {
				maxInFlight = max(maxInFlight, m["cdcrelay_confirms_in_flight"])
			}
			mu.Unlock()
		}
	}()

	link.SetRate(slowRate)
	began := time.Now()
	// 200 transactions of 1,000 events: the burst commits in a few seconds.
	w.insert(t, backlog/1000, 1000)
	inserted := time.Since(began)
	time.Sleep(max(0, slowFor-time.Since(began)))
	slowDelivered := w.consumer.Count() - 1000
	link.SetRate(0)
	fast := time.Now()
	w.waitAll(t, 3*time.Minute)
	drained := time.Since(fast)
	close(stop)
	<-sampled
	if exited, err := p.Exited(); exited {
		t.Fatalf("relay exited: %v", err)
	}
	_, peak, err := testenv.Memory(pid)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	note := fmt.Sprintf("RSS before the backlog %d MiB (peak so far %d MiB); peak RSS (VmHWM) %d MiB, highest sampled %d MiB; "+
		"max in flight %v (window 1000); backlog committed in %s; %d events delivered during %s at 200 KB/s, the rest in %s",
		baseline>>10, baselinePeak>>10, peak>>10, maxRSS>>10, maxInFlight, inserted.Round(100*time.Millisecond),
		slowDelivered, slowFor, drained.Round(100*time.Millisecond))
	w.checkRecovered(t, "slow broker (200 KB/s) with a 200,000-event backlog", drained, note)
	if maxInFlight > 1000 {
		t.Errorf("%v messages in flight, above the window of 1000", maxInFlight)
	}
	if peak-baseline > budget {
		t.Errorf("peak RSS %d KiB is %d KiB above the %d KiB before the backlog: memory grows with the backlog", peak, peak-baseline, baseline)
	}
}
