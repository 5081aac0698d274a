package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/brokerapi"
	"github.com/cdcrelay/cdcrelay/internal/config"
)

// tailer is one run of tail. Only the goroutine running print (and,
// before it, openTail) uses it.
type tailer struct {
	cfg         *config.Config
	filter      string // the BINDING_KEY argument
	route       bool
	api         *brokerapi.Client
	conn        *amqp.Connection
	ch          *amqp.Channel
	vhost, user string
	queue       string
	deliveries  <-chan amqp.Delivery

	kind      string                 // the exchange's type, as last read
	plan      []tailBinding          // the bindings last copied
	bound     map[string]tailBinding // the bindings tail's queue has, by id
	notes     []string               // what tail cannot show, as last judged
	lastNotes []string               // what was printed of it
}

// followTimeout bounds one reading of the bindings.
const followTimeout = 5 * time.Second

// openAPI opens the management API tail reads the bindings with.
func (t *tailer) openAPI() error {
	raw := strings.TrimSpace(t.cfg.AMQPManagementURL)
	if raw == "" {
		return fmt.Errorf("tail copies the bindings of the queues already bound to exchange %q, so that watching never delivers an event no queue is bound for, "+
			"and it reads them through the management API: set %s=http://user:password@host:15672 (a user with the monitoring or management tag and access to the vhost). "+
			"On a throwaway setup, tail -route KEY binds without it, as a route of its own", t.cfg.Exchange, brokerapi.Variable)
	}
	var tc *tls.Config
	if u, err := url.Parse(raw); err == nil && u.Scheme == "https" {
		if tc, err = t.cfg.AMQPTLS(); err != nil {
			return fmt.Errorf("broker TLS: %w", err)
		}
	}
	api, err := brokerapi.New(raw, config.Redact(raw), tc)
	if err != nil {
		return fmt.Errorf("%s: %w", brokerapi.Variable, err)
	}
	t.api = api
	return nil
}

// follow makes tail's bindings a copy of the other queues' bindings as
// they are now. When the bindings cannot be read, it removes tail's own:
// a copy of a binding that may be gone could be an event's only route.
func (t *tailer) follow(ctx context.Context) error {
	if t.cfg.Exchange == "" {
		return errors.New("CDCRELAY_EXCHANGE is the default exchange, which delivers to the queue a routing key names and takes no binding: tail cannot copy its routes")
	}
	ctx, cancel := context.WithTimeout(ctx, followTimeout)
	defer cancel()
	ex, err := t.api.Exchange(ctx, t.vhost, t.cfg.Exchange)
	var bs []brokerapi.Binding
	if err == nil {
		bs, err = t.api.Bindings(ctx, t.vhost, t.cfg.Exchange)
	}
	if errors.Is(err, brokerapi.ErrNotFound) {
		return fmt.Errorf("exchange %q on vhost %q: %w (declare the exchange, or set CDCRELAY_EXCHANGE to the relay's)", t.cfg.Exchange, t.vhost, err)
	}
	var plan []tailBinding
	var notes []string
	switch {
	case err != nil && t.bound == nil:
		return fmt.Errorf("read the bindings of exchange %q through %s: %w", t.cfg.Exchange, brokerapi.Variable, err)
	case err != nil:
		notes = []string{fmt.Sprintf("could not read the bindings (%v): copying none until they can be read", err)}
	default:
		if plan, notes, err = mirrorPlan(ex, bs); err != nil {
			return fmt.Errorf("tail does not watch %w; watch the queues behind it with their own tools", err)
		}
		if len(plan) == 0 {
			notes = append(notes, fmt.Sprintf("no queue is bound to exchange %q: the broker delivers nothing, so there is nothing to show, and an event published now is unroutable, with or without tail", t.cfg.Exchange))
		}
	}
	if err := t.rebind(plan); err != nil {
		return err
	}
	t.kind, t.plan, t.notes = ex.Type, plan, notes
	return nil
}

// rebind gives tail's queue exactly plan's bindings, removing first.
func (t *tailer) rebind(plan []tailBinding) error {
	want := map[string]tailBinding{}
	for _, b := range plan {
		want[b.id] = b
	}
	for id, b := range t.bound {
		if _, ok := want[id]; !ok {
			if err := t.ch.QueueUnbind(t.queue, b.key, t.cfg.Exchange, b.args); err != nil {
				return t.refused(fmt.Sprintf("unbind %q from exchange %q", b.key, t.cfg.Exchange), err)
			}
			delete(t.bound, id)
		}
	}
	if t.bound == nil {
		t.bound = map[string]tailBinding{}
	}
	for id, b := range want {
		if _, ok := t.bound[id]; !ok {
			if err := t.ch.QueueBind(t.queue, b.key, t.cfg.Exchange, false, b.args); err != nil {
				return t.refused(fmt.Sprintf("bind to exchange %q", t.cfg.Exchange), err)
			}
			t.bound[id] = b
		}
	}
	return nil
}

// takeNotes returns the notes when they changed since last taken.
func (t *tailer) takeNotes() []string {
	if slices.Equal(t.notes, t.lastNotes) {
		return nil
	}
	t.lastNotes = t.notes
	return t.notes
}

// alone is a warning when d matches none of the bindings tail copies now:
// the binding it came through was removed within the last second, and d
// may have reached tail only.
func (t *tailer) alone(d amqp.Delivery) string {
	if matched, ok := matchedElsewhere(t.kind, t.plan, d.RoutingKey); !ok || matched {
		return ""
	}
	return fmt.Sprintf("message %s (routing key %q) matches none of the bindings tail copies now: the binding it was copied from went away in the last second, "+
		"so it may have reached tail alone, unseen by any consumer though the relay marked it published", orDash(d.MessageId), d.RoutingKey)
}

// close closes the connection, which deletes tail's queue.
func (t *tailer) close() {
	if t.conn != nil {
		_ = t.conn.Close()
	}
}

// shellWord quotes s for a shell when it needs it.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
