package inbox

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// recorder is an amqp.Acknowledger that records what was done.
type recorder struct{ acks, nacks, requeues int }

func (r *recorder) Ack(uint64, bool) error { r.acks++; return nil }
func (r *recorder) Nack(_ uint64, _ bool, requeue bool) error {
	r.nacks++
	if requeue {
		r.requeues++
	}
	return nil
}
func (r *recorder) Reject(tag uint64, requeue bool) error { return r.Nack(tag, false, requeue) }

// noDB fails every transaction, like a database that is down.
type noDB struct{}

func (noDB) Begin(context.Context) (pgx.Tx, error) { return nil, errors.New("database down") }

func TestNoMessageIDIsDeadLettered(t *testing.T) {
	ib, err := New(noDB{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for name, handle := range map[string]func(amqp.Delivery) (Result, error){
		"Handle": func(d amqp.Delivery) (Result, error) {
			return ib.Handle(t.Context(), d, "h", func(context.Context, pgx.Tx, Event) error { t.Fatal("handler ran"); return nil })
		},
		"HandleEffect": func(d amqp.Delivery) (Result, error) {
			return ib.HandleEffect(t.Context(), d, "h", func(context.Context, Event) error { t.Fatal("handler ran"); return nil })
		},
	} {
		rec := &recorder{}
		res, err := handle(amqp.Delivery{Acknowledger: rec, Body: []byte("{}")})
		if !errors.Is(err, ErrNoMessageID) || res != Rejected || rec.nacks != 1 || rec.requeues != 0 || rec.acks != 0 {
			t.Errorf("%s: %v, %v, %+v; want ErrNoMessageID, rejected, one nack without requeue", name, res, err, rec)
		}
	}
}

func TestDatabaseDownRequeues(t *testing.T) {
	ib, err := New(noDB{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	res, err := ib.Handle(t.Context(), amqp.Delivery{Acknowledger: rec, MessageId: "m"}, "h",
		func(context.Context, pgx.Tx, Event) error { t.Fatal("handler ran"); return nil })
	if err == nil || res != Requeued || rec.requeues != 1 || rec.acks != 0 {
		t.Errorf("Handle with the database down: %v, %v, %+v; want an error, requeued", res, err, rec)
	}
}

func TestRequeueWrapping(t *testing.T) {
	base := errors.New("smtp timeout")
	if Requeue(nil) != nil {
		t.Error("Requeue(nil) is not nil")
	}
	wrapped := Requeue(base)
	if !wantsRequeue(wrapped) || !errors.Is(wrapped, base) || wrapped.Error() != base.Error() {
		t.Errorf("Requeue(%v) = %v: want a requeue error wrapping it", base, wrapped)
	}
	if wantsRequeue(base) {
		t.Error("a plain error asks for requeue")
	}
}
