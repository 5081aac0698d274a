package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// tail binds a temporary queue to the relay's exchange and prints what
// arrives, like a console consumer: for a person who wants to see what is
// published (the tour, the runbook, the chart's NOTES), without the
// broker's management plugin. The queue is exclusive and auto-delete, so
// it disappears with the command and takes nothing from other consumers.
func tail(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	count := fs.Int("n", 0, "exit after this many messages (0: until interrupted)")
	wait := fs.Duration("timeout", 0, "exit with an error if no message arrives for this long (0: wait forever)")
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: cdcrelay tail [-n N] [-timeout D] [BINDING_KEY]\n\n"+
			"Binds a temporary queue to CDCRELAY_EXCHANGE with BINDING_KEY (default #, every routing key)\n"+
			"and prints each message: routing key, message id, type, headers and body.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if fs.NArg() > 1 {
		fs.Usage()
		return errors.New("tail: at most one binding key")
	}
	key := "#"
	if fs.NArg() == 1 {
		key = fs.Arg(0)
	}
	cfg, err := config.Load(ctx)
	if err != nil {
		return fmt.Errorf("configuration:\n%w", err)
	}
	if err := cfg.RequireBroker(); err != nil {
		return fmt.Errorf("configuration:\n%w", err)
	}
	deliveries, closeFn, err := tailQueue(&cfg, key)
	if err != nil {
		return err
	}
	defer closeFn()
	fmt.Fprintf(stderr, "cdcrelay tail: exchange %q, binding key %q; waiting for messages (Ctrl-C stops)\n", cfg.Exchange, key)
	return printDeliveries(ctx, deliveries, stdout, *count, *wait)
}

// tailQueue connects and consumes from a new exclusive queue bound to the
// exchange with key.
func tailQueue(cfg *config.Config, key string) (<-chan amqp.Delivery, func(), error) {
	tlsConfig, err := cfg.AMQPTLS()
	if err != nil {
		return nil, nil, fmt.Errorf("broker TLS: %w", err)
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("cdcrelay tail")
	conn, err := amqp.DialConfig(cfg.AMQPURL, amqp.Config{Properties: props, TLSClientConfig: tlsConfig, Locale: "en_US"})
	if err != nil {
		return nil, nil, fmt.Errorf("connect to the broker: %w", err)
	}
	fail := func(what string, err error) (<-chan amqp.Delivery, func(), error) {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fail("open a channel", err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return fail("declare a temporary queue", err)
	}
	if err := ch.QueueBind(q.Name, key, cfg.Exchange, false, nil); err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			err = fmt.Errorf("%w (declare the exchange, or set CDCRELAY_EXCHANGE to the relay's)", err)
		}
		return fail(fmt.Sprintf("bind to exchange %q", cfg.Exchange), err)
	}
	deliveries, err := ch.Consume(q.Name, "cdcrelay-tail", true, true, false, false, nil)
	if err != nil {
		return fail("consume", err)
	}
	return deliveries, func() { _ = conn.Close() }, nil
}

// printDeliveries prints each delivery until ctx ends (nil), n have been
// printed (nil), no message came for wait (an error), or the broker closed
// the connection (an error).
func printDeliveries(ctx context.Context, deliveries <-chan amqp.Delivery, w io.Writer, n int, wait time.Duration) error {
	var idle <-chan time.Time
	for printed := 0; n == 0 || printed < n; printed++ {
		if wait > 0 {
			idle = time.After(wait)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-idle:
			return fmt.Errorf("tail: no message for %s", wait)
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("tail: the broker closed the connection")
			}
			fmt.Fprint(w, formatDelivery(d))
		}
	}
	return nil
}

// formatDelivery is one message: a line of its properties, a line of its
// headers (sorted), the body, and a blank line.
func formatDelivery(d amqp.Delivery) string {
	var b strings.Builder
	fmt.Fprintf(&b, "routing_key=%s message_id=%s", d.RoutingKey, orDash(d.MessageId))
	if d.Type != "" {
		fmt.Fprintf(&b, " type=%s", d.Type)
	}
	if !d.Timestamp.IsZero() {
		fmt.Fprintf(&b, " timestamp=%s", d.Timestamp.UTC().Format(time.RFC3339))
	}
	if d.ContentType != "" {
		fmt.Fprintf(&b, " content_type=%s", d.ContentType)
	}
	b.WriteString("\n")
	if len(d.Headers) > 0 {
		names := make([]string, 0, len(d.Headers))
		for k := range d.Headers {
			names = append(names, k)
		}
		sort.Strings(names)
		b.WriteString("headers:")
		for _, k := range names {
			fmt.Fprintf(&b, " %s=%v", k, d.Headers[k])
		}
		b.WriteString("\n")
	}
	if utf8.Valid(d.Body) {
		b.Write(d.Body)
	} else {
		fmt.Fprintf(&b, "(%d bytes, not UTF-8)", len(d.Body))
	}
	b.WriteString("\n\n")
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
