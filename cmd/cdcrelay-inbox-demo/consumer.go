package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/inbox"
)

// The consumer runs as a child process of the demo (the demo's own binary,
// with roleEnv set), so that the demo can see it killed and start another.
const (
	roleEnv     = "CDCRELAY_INBOX_DEMO_ROLE"
	dbEnv       = "CDCRELAY_INBOX_DEMO_DB"
	amqpEnv     = "CDCRELAY_INBOX_DEMO_AMQP"
	queueEnv    = "CDCRELAY_INBOX_DEMO_QUEUE"
	dieAfterEnv = "CDCRELAY_INBOX_DEMO_DIE_AFTER"
	handlerName = "demo-orders"
	// duplicateMark starts the line the consumer prints for each copy the
	// inbox absorbed; the demo counts them.
	duplicateMark = "DUPLICATE absorbed"
)

// consume is the consumer process: every delivery goes through
// inbox.Handle, whose handler applies the order's effect (a row in
// demo_applied) in the inbox's transaction. With dieAfterEnv set to n, the
// process kills itself with SIGKILL in the ack of the n-th event it
// applied: after the commit, before the broker hears of it, the worst
// moment for a consumer without an inbox. SIGTERM ends it with a summary.
func consume() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := consumeUntilDone(ctx); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stdout, "error:", err)
		return 1
	}
	return 0
}

func consumeUntilDone(ctx context.Context) error {
	dieAfter, _ := strconv.Atoi(os.Getenv(dieAfterEnv))
	db, err := pgx.Connect(ctx, os.Getenv(dbEnv))
	if err != nil {
		return fmt.Errorf("connect to the consumer's database: %w", err)
	}
	defer func() { _ = db.Close(context.WithoutCancel(ctx)) }()
	reg := prometheus.NewRegistry()
	ib, err := inbox.New(db, inbox.Options{Registerer: reg, Logger: slog.New(slog.NewTextHandler(os.Stdout, nil))})
	if err != nil {
		return err
	}
	conn, err := amqp.Dial(os.Getenv(amqpEnv))
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(20, 0, false); err != nil {
		return err
	}
	msgs, err := ch.Consume(os.Getenv(queueEnv), "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "consuming with inbox handler %q (pid %d)\n", handlerName, os.Getpid())
	defer func() {
		fmt.Fprintf(os.Stdout, "stopping: handled %g, duplicates absorbed %g\n",
			sum(reg, "cdcrelay_inbox_handled_total"), sum(reg, "cdcrelay_inbox_duplicates_total"))
	}()
	applied := 0
	for {
		var d amqp.Delivery
		select {
		case <-ctx.Done():
			return ctx.Err()
		case d = <-msgs:
		}
		k := &killSwitch{Acknowledger: d.Acknowledger}
		d.Acknowledger = k
		res, err := ib.Handle(ctx, d, handlerName, func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
			var order struct {
				OrderID int `json:"order_id"`
			}
			if err := json.Unmarshal(ev.Delivery.Body, &order); err != nil {
				return fmt.Errorf("not an order: %w", err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO demo_applied (order_id, message_id) VALUES ($1, $2)`, order.OrderID, ev.MessageID); err != nil {
				return err
			}
			applied++
			k.armed = applied == dieAfter
			return nil
		})
		switch {
		case err != nil:
			fmt.Fprintf(os.Stdout, "%s %s: %v\n", d.MessageId, res, err)
		case res == inbox.Duplicate:
			fmt.Fprintf(os.Stdout, "%s id=%s (redelivered %v)\n", duplicateMark, d.MessageId, d.Redelivered)
		}
	}
}

// killSwitch kills the process when the inbox acks, once armed.
type killSwitch struct {
	amqp.Acknowledger
	armed bool
}

func (k *killSwitch) Ack(tag uint64, multiple bool) error {
	if k.armed {
		fmt.Fprintln(os.Stdout, "killing myself with SIGKILL: the effect is committed, the ack not sent")
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	return k.Acknowledger.Ack(tag, multiple)
}

// sum is a counter family's total over its series (0 when absent).
func sum(reg prometheus.Gatherer, name string) float64 {
	families, _ := reg.Gather()
	total := 0.0
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}
