package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/brokerapi"
	"github.com/cdcrelay/cdcrelay/internal/config"
)

// tailUsage is tail's help text.
const tailUsage = `usage: cdcrelay tail [-n N] [-timeout D] [-route] [BINDING_KEY]

Prints what the relay publishes to CDCRELAY_EXCHANGE: routing key, message id, type,
headers and body of each message whose routing key matches BINDING_KEY (a topic
pattern, default #).

By default tail only watches: it copies the bindings of the queues already bound to
the exchange (read through CDCRELAY_AMQP_MANAGEMENT_URL) onto a temporary queue of its
own, so it receives a copy of what those queues receive and nothing else. An event no
queue is bound for stays unroutable (the relay waits, or parks it), as it would without
tail. The copy follows bindings as they change, checked every second.

-route binds the temporary queue with BINDING_KEY itself, without the management API:
tail is then a route of its own, and an event that no other queue takes is delivered
only to tail and marked published. Use it on a throwaway setup, never during an
unroutable stall.

`

// tail prints what is published, like a console consumer: for a person who
// wants to see the events (the tour, the runbook, the chart's NOTES). Its
// queue is exclusive and auto-delete, so it goes with the command.
func tail(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	count := fs.Int("n", 0, "exit after this many messages (0: until interrupted)")
	wait := fs.Duration("timeout", 0, "exit with an error if no message arrives for this long (0: wait forever)")
	route := fs.Bool("route", false, "bind with BINDING_KEY itself: tail becomes a route of its own (see above)")
	fs.Usage = func() {
		fmt.Fprint(stderr, tailUsage)
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
	t, err := openTail(ctx, &cfg, key, *route)
	if err != nil {
		return err
	}
	defer t.close()
	if *route {
		fmt.Fprintf(stderr, "cdcrelay tail: exchange %q, binding key %q: tail is a route of its own (-route): an event no other queue takes is delivered only here and marked published\n", cfg.Exchange, key)
	}
	fmt.Fprintf(stderr, "cdcrelay tail: waiting for messages (Ctrl-C stops)\n")
	return t.print(ctx, stdout, stderr, *count, *wait)
}

// openTail connects to the first node that answers, declares tail's queue
// and binds it: with key (route) or with a copy of the exchange's
// bindings.
func openTail(ctx context.Context, cfg *config.Config, key string, route bool) (*tailer, error) {
	t := &tailer{cfg: cfg, filter: key, route: route}
	if !route {
		if err := t.openAPI(); err != nil {
			return nil, err
		}
	}
	if err := t.dial(); err != nil {
		return nil, err
	}
	if err := t.declare(ctx); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

// dial connects to the first node of CDCRELAY_AMQP_URL that answers.
func (t *tailer) dial() error {
	tlsConfig, err := t.cfg.AMQPTLS()
	if err != nil {
		return fmt.Errorf("broker TLS: %w", err)
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("cdcrelay tail")
	var errs []error
	for _, node := range t.cfg.AMQPNodes() {
		conn, err := amqp.DialConfig(node, amqp.Config{Properties: props, TLSClientConfig: tlsConfig, Locale: "en_US"})
		if err == nil {
			t.conn = conn
			if uri, err := amqp.ParseURI(node); err == nil {
				t.vhost, t.user = uri.Vhost, uri.Username
			}
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", config.AMQPNodeAddr(node), err))
	}
	return fmt.Errorf("connect to the broker: %w", errors.Join(errs...))
}

// declare declares tail's queue, binds it and starts consuming.
func (t *tailer) declare(ctx context.Context) error {
	ch, err := t.conn.Channel()
	if err != nil {
		return fmt.Errorf("open a channel: %w", err)
	}
	t.ch = ch
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	t.queue = tailQueuePrefix + hex.EncodeToString(suffix)
	if _, err := ch.QueueDeclare(t.queue, false, true, true, false, nil); err != nil {
		return t.refused(fmt.Sprintf("declare queue %q", t.queue), err)
	}
	if t.route {
		if err := ch.QueueBind(t.queue, t.filter, t.cfg.Exchange, false, nil); err != nil {
			return t.refused(fmt.Sprintf("bind to exchange %q", t.cfg.Exchange), err)
		}
	} else if err := t.follow(ctx); err != nil {
		return err
	}
	deliveries, err := ch.Consume(t.queue, "cdcrelay-tail", true, true, false, false, nil)
	if err != nil {
		return t.refused(fmt.Sprintf("consume from %q", t.queue), err)
	}
	t.deliveries = deliveries
	return nil
}

// refused adds what to do to an error of the broker's: a missing exchange,
// or a permission the user lacks (RabbitMQ's 403 names the resource, not
// the permission).
func (t *tailer) refused(what string, err error) error {
	var aerr *amqp.Error
	if errors.As(err, &aerr) {
		switch aerr.Code {
		case amqp.NotFound:
			return fmt.Errorf("%s: %w (declare the exchange, or set CDCRELAY_EXCHANGE to the relay's)", what, err)
		case amqp.AccessRefused:
			return fmt.Errorf("%s: %w\n%s", what, err, tailPermissions(t.vhost, t.user, t.cfg.Exchange))
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// tailPermissions says which permissions tail needs on vhost: configure
// and write on its own queues (declare, bind), read on them and on the
// exchange (bind, consume). The relay's own user needs write on the
// exchange only, so a least-privilege relay user lacks these.
func tailPermissions(vhost, user, exchange string) string {
	q := brokerapi.TailQueuePattern
	return fmt.Sprintf("tail needs, on vhost %q: configure and write on its queues (%s), read on them and on exchange %q. "+
		"Run tail as a user that has them (CDCRELAY_AMQP_URL for this command only), or grant them to %q: "+
		"rabbitmqctl set_permissions -p %s %s '%s' '%s' '%s' (this replaces the user's permissions on the vhost: merge them with what it has)",
		vhost, q, exchange, user, shellWord(vhost), shellWord(user), q, q, fmt.Sprintf(`^(%s.*|%s)$`, strings.TrimPrefix(q, "^"), regexp.QuoteMeta(exchange)))
}

// print prints each delivery until ctx ends (nil), n have been printed
// (nil), no message came for wait (an error), or the broker closed the
// connection (an error). Without -route it follows the bindings every
// second.
func (t *tailer) print(ctx context.Context, w, stderr io.Writer, n int, wait time.Duration) error {
	var idle <-chan time.Time
	var refresh <-chan time.Time
	if !t.route {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		refresh = tick.C
	}
	for printed := 0; n == 0 || printed < n; {
		if wait > 0 && idle == nil {
			idle = time.After(wait)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-idle:
			return fmt.Errorf("tail: no message for %s", wait)
		case <-refresh:
			if err := t.follow(ctx); err != nil {
				return err
			}
			for _, note := range t.takeNotes() {
				fmt.Fprintln(stderr, "cdcrelay tail: "+note)
			}
		case d, ok := <-t.deliveries:
			if !ok {
				return errors.New("tail: the broker closed the connection")
			}
			if !t.route {
				if warning := t.alone(d); warning != "" {
					fmt.Fprintln(stderr, "cdcrelay tail: WARNING: "+warning)
				}
				if !matchesFilter(t.filter, d.RoutingKey) {
					continue
				}
			}
			fmt.Fprint(w, formatDelivery(d))
			printed++
			idle = nil
		}
	}
	return nil
}

// matchesFilter is the printing filter of the default mode: a topic
// pattern over the routing key, whatever the exchange's type.
func matchesFilter(pattern, routingKey string) bool {
	return pattern == "#" || brokerapi.TopicMatch(pattern, routingKey)
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
