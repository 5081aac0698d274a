package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/inbox"
)

// childMarker in the environment makes the test binary a consumer process
// instead of running tests: the crash tests start it, and it kills itself
// with SIGKILL at the point INBOX_CHILD_CRASH_ON names, as a crash would.
const childMarker = "INBOX_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childMarker) != "" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

// runChild consumes the queue until killed (or a minute passes): mode "tx"
// runs Handle with an effect row in the handler's transaction and dies in
// the Ack of the message INBOX_CHILD_CRASH_ON names, after the commit;
// mode "effect" runs HandleEffect with an effect outside the database (a
// line appended to a file) and dies in the handler of that message, after
// its effect.
func runChild() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := child(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

func child(ctx context.Context) error {
	crashOn := os.Getenv("INBOX_CHILD_CRASH_ON")
	leaseMs, err := strconv.Atoi(os.Getenv("INBOX_CHILD_LEASE"))
	if err != nil {
		return err
	}
	db, err := pgx.Connect(ctx, os.Getenv("INBOX_CHILD_DB"))
	if err != nil {
		return err
	}
	defer func() { _ = db.Close(context.WithoutCancel(ctx)) }()
	ib, err := inbox.New(db, inbox.Options{Lease: time.Duration(leaseMs) * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		return err
	}
	conn, err := amqp.Dial(os.Getenv("INBOX_CHILD_AMQP"))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(10, 0, false); err != nil {
		return err
	}
	msgs, err := ch.Consume(os.Getenv("INBOX_CHILD_QUEUE"), "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	effectsFile := os.Getenv("INBOX_CHILD_EFFECTS_FILE")
	for {
		var d amqp.Delivery
		select {
		case <-ctx.Done():
			return ctx.Err()
		case d = <-msgs:
		}
		var res inbox.Result
		switch os.Getenv("INBOX_CHILD_MODE") {
		case "tx":
			if d.MessageId == crashOn {
				d.Acknowledger = dieOnAck{d.Acknowledger}
			}
			res, err = ib.Handle(ctx, d, "effects", insertEffect)
		case "effect":
			res, err = ib.HandleEffect(ctx, d, "mailer", func(_ context.Context, ev inbox.Event) error {
				if err := appendEffect(effectsFile, ev); err != nil {
					return err
				}
				if ev.MessageID == crashOn {
					die()
				}
				return nil
			})
		}
		fmt.Fprintf(os.Stderr, "child: %s %s %v\n", d.MessageId, res, err)
	}
}

// insertEffect is the transactional handler of the tests: one effect row.
func insertEffect(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (message_id, attempt) VALUES ($1, $2)`, ev.MessageID, ev.Attempt)
	return err
}

// appendEffect is the tests' effect outside the database: a line
// "message_id:attempt" appended to a file.
func appendEffect(path string, ev inbox.Event) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(f, "%s:%d\n", ev.MessageID, ev.Attempt); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// dieOnAck kills the process when the inbox acks: after the handler's
// transaction committed, before the broker hears of it.
type dieOnAck struct{ amqp.Acknowledger }

func (dieOnAck) Ack(uint64, bool) error {
	die()
	return nil
}

func die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
