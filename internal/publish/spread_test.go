package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"golang.org/x/sync/semaphore"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

type spreadTestAcker struct{}

func (spreadTestAcker) Ack(Ref)            {}
func (spreadTestAcker) Parked(Ref, string) {}
func (spreadTestAcker) Resumed(Ref)        {}
func (spreadTestAcker) Ending()            {}

// A failed session must end even when no new event arrives: the relay
// restarts both sides only once Run returns. With several channels the
// goroutine that deals events to the lanes used to wait on In alone, so
// after a nack or a closed connection on an idle outbox Run never
// returned and the failed event was not published again until the next
// row was written (found by TestPipelineModel).
func TestPublisherEndsAfterFailureWithIdleInput(t *testing.T) {
	for _, channels := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("channels-%d", channels), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newFakeBroker(uint64(channels), channels)
				conn, link := b.connect(8)
				in := make(chan wal.Event, 1) // never closed: the outbox is idle
				budget := semaphore.NewWeighted(1 << 20)
				p := newPublisher(link, in, spreadTestAcker{}, budget, PublisherConfig{
					Exchange:    b.exchange,
					MaxInFlight: 8, MaxInFlightBytes: 1 << 20, ConfirmTimeout: time.Hour,
					MaxMessageBytes: 1 << 20,
					Log:             slog.New(slog.DiscardHandler), Metrics: NewMetrics(prometheus.NewRegistry(), ""),
				})
				done := make(chan error, 1)
				go func() { done <- p.Run(context.Background()) }()
				ev := wal.Event{ID: "e1", RoutingKey: "k", Payload: []byte(`{}`), PayloadIsJSON: true}
				if !budget.TryAcquire(ev.Weight(1 << 20)) { // as the WAL reader does
					t.Fatal("an empty budget has no room for one event")
				}
				in <- ev
				synctest.Wait() // every goroutine waits: the event is published
				b.mu.Lock()
				published := b.stats.published
				b.mu.Unlock()
				if published == 0 {
					t.Fatal("nothing published once every goroutine waits")
				}
				b.closeConn(conn, &amqp.Error{Code: amqp.ConnectionForced, Reason: "test", Server: true}, false)
				select {
				case err := <-done:
					if !errors.Is(err, ErrClosed) {
						t.Fatalf("Run = %v, want ErrClosed", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("Run still running 10s after the connection closed while In was idle")
				}
			})
		})
	}
}
