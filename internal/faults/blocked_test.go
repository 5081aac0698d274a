//go:build faults

package faults_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
)

// insertPaddedSQL is relaytest's insert with a pad: the first row of the
// transaction carries $3 bytes of padding when $3 > 0.
const insertPaddedSQL = `
	INSERT INTO event_outbox (routing_key, payload)
	SELECT $1, jsonb_build_object('n', g, 'tx', txid_current(), 'event_type', 'TestEvent')
		|| CASE WHEN g = 1 AND $3 > 0 THEN jsonb_build_object('pad', repeat('x', $3)) ELSE '{}'::jsonb END
	FROM generate_series(1, $2) g
	RETURNING id::text`

// loadPadded is load with a large first event in every bigEvery-th
// transaction (pad bytes), so the relay's socket writes outgrow the
// kernel's buffers and really block once the broker stops reading. It
// runs until total events are committed; a failed insert stops it (the
// database is not the fault here) and wait reports it.
func (w *world) loadPadded(total, rate, txSize, bigEvery, pad int) *loader {
	ctx, cancel := context.WithCancel(context.Background())
	l := &loader{done: make(chan struct{}), cancel: cancel}
	db := w.connect()
	// Registered after connect, so it runs first: the loader stops before
	// its connection is closed (cleanups run last registered first).
	w.t.Cleanup(func() { cancel(); <-l.done })
	go func() {
		defer close(l.done)
		interval := time.Duration(float64(time.Second) * float64(txSize) / float64(rate))
		next := time.Now()
		for i := 0; l.count() < total && ctx.Err() == nil; i++ {
			n, padding := min(txSize, total-l.count()), 0
			if i%bigEvery == 0 {
				padding = pad
			}
			var ids []string
			err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
				rows, err := tx.Query(ctx, insertPaddedSQL, routingKeys[i%len(routingKeys)], n, padding)
				if err != nil {
					return err
				}
				ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
				return err
			})
			if err != nil {
				if ctx.Err() == nil {
					l.fail(err)
				}
				return
			}
			l.record(ids)
			next = next.Add(interval)
			if d := time.Until(next); d > 0 {
				sleepCtx(ctx, d)
			}
		}
	}()
	return l
}

// readyz returns the relay process's /readyz status code and body.
func (p *process) readyz(t *testing.T) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.httpAddr + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// metric is one summed family of the process's /metrics.
func (p *process) metric(t *testing.T, name string) float64 {
	t.Helper()
	m, err := p.metrics(name)
	if err != nil {
		t.Fatalf("scrape %s: %v", name, err)
	}
	return m[name]
}

// TestIntegrationBrokerBlockedUnderLoad raises a private node's memory
// alarm for 15 s while the relay binary streams about 200 events/s, one
// transaction in ten led by a 384 KiB event, so the relay's socket write
// blocks while the broker stops reading (connection.blocked). While
// blocked the relay reports it (cdcrelay_broker_blocked 1, /readyz still
// 200 and saying so); once the alarm clears it goes on in the same
// session: no restart, nothing lost, nothing published twice.
func TestIntegrationBrokerBlockedUnderLoad(t *testing.T) {
	const (
		rate     = 200
		txSize   = 4
		bigEvery = 10        // transactions
		pad      = 384 << 10 // bytes, several times a loopback socket's buffers
		alarm    = 15 * time.Second
		total    = 7000 // about 35 s of load: before, during and after the alarm
	)
	rmq := testenv.MustRabbitMQ(t, testenv.RabbitMQOptions{})
	w := newWorld(t, worldOptions{Broker: rmq})
	// A heartbeat of 3 s: the client gives up on a broker silent for three
	// of them (9 s), well within the alarm. Reads must go on while writes
	// are blocked (coalesce.Conn moves the read deadline; amqp091-go's own
	// mover waits behind the blocked write).
	p := w.startProcess(processOptions{Race: true, Extra: map[string]string{"AMQP_HEARTBEAT": "3s"}})
	testenv.WaitSlotActive(t, w.db, slotName, time.Minute)
	waitFor(t, "relay ready", 30*time.Second, func() bool { code, _ := p.readyz(t); return code == http.StatusOK })
	ctx := context.Background()

	l := w.loadPadded(total, rate, txSize, bigEvery, pad)
	l.waitEvents(t, 1000, time.Minute)
	testenv.WaitCount(t, w.consumer, 500, time.Minute)
	restarts := p.metric(t, "cdcrelay_pipeline_restarts_total")

	// The alarm's times are taken once rabbitmqctl has returned: the
	// command itself takes seconds on a busy machine.
	if err := rmq.SetMemoryHighWatermark(ctx, 0); err != nil {
		t.Fatal(err)
	}
	raised := time.Now()
	t.Cleanup(func() { _ = rmq.SetMemoryHighWatermark(context.Background(), 0.4) })
	waitFor(t, "relay reports the broker blocking it", 10*time.Second, func() bool {
		return p.metric(t, "cdcrelay_broker_blocked") == 1
	})
	blockedSeen := time.Since(raised)
	// Watch the relay all through the alarm: ready, saying why it does not
	// publish, still blocked.
	var polls, saidBlocked int
	var lastBody string
	for time.Since(raised) < alarm {
		code, body := p.readyz(t)
		if code != http.StatusOK {
			t.Fatalf("/readyz %d %q while the broker blocks publishers: the relay is streaming and must stay ready", code, body)
		}
		polls++
		if strings.Contains(body, "blocked") {
			saidBlocked++
		}
		lastBody = body
		if v := p.metric(t, "cdcrelay_broker_blocked"); v != 1 {
			t.Fatalf("cdcrelay_broker_blocked %v during the alarm", v)
		}
		time.Sleep(250 * time.Millisecond)
	}
	deliveredBlocked := w.consumer.Count()
	committedBlocked := l.count()

	clearing := time.Now()
	if err := rmq.SetMemoryHighWatermark(ctx, 0.4); err != nil {
		t.Fatal(err)
	}
	cleared := time.Now()
	// Resumed: the first delivery the consumer gets after the alarm
	// cleared (the consumer itself was never blocked: it does not publish).
	var resumed time.Duration
	waitFor(t, "delivery resumes after the alarm cleared", time.Minute, func() bool {
		for _, d := range w.consumer.DeliveriesFrom(deliveredBlocked) {
			if d.ReceivedAt.After(cleared) {
				resumed = d.ReceivedAt.Sub(cleared)
				return true
			}
		}
		return false
	})
	waitFor(t, "relay reports the block lifted", 10*time.Second, func() bool {
		return p.metric(t, "cdcrelay_broker_blocked") == 0
	})
	l.wait(t, 2*time.Minute)
	if len(l.errs) > 0 {
		t.Fatalf("loader stopped: %s", l.errs[0])
	}
	w.waitAll(t, 2*time.Minute)
	caughtUp := time.Since(cleared)
	if exited, err := p.Exited(); exited {
		t.Fatalf("relay exited: %v", err)
	}
	if n := p.metric(t, "cdcrelay_pipeline_restarts_total"); n != restarts {
		t.Errorf("the relay restarted %v times around the alarm; want it to wait in the same session", n-restarts)
	}
	o := w.check(t, "broker blocks publishers (memory alarm) 15s under load with 384 KiB events", cleared, l.since(raised),
		fmt.Sprintf("alarm %s; blocked reported %s after it was raised; %d events committed and %d delivered by the end of the alarm; first delivery %s after it cleared (rabbitmqctl took %s), all caught up after %s; 0 restarts",
			cleared.Sub(raised).Round(100*time.Millisecond), blockedSeen.Round(10*time.Millisecond), committedBlocked, deliveredBlocked,
			resumed.Round(10*time.Millisecond), cleared.Sub(clearing).Round(10*time.Millisecond), caughtUp.Round(100*time.Millisecond)))
	if o.Duplicates != 0 {
		t.Errorf("%d duplicates without a restart: an acknowledged event was published again", o.Duplicates)
	}
	t.Logf("/readyz during the alarm: %d of %d polls said blocked; last body %q", saidBlocked, polls, lastBody)
	if saidBlocked == 0 {
		t.Errorf("/readyz never said the broker blocks publishers (last body %q)", lastBody)
	}
}
