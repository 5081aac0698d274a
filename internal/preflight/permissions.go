package preflight

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/brokerapi"
)

// checkPermissions names the findings about the broker user's permissions.
const checkPermissions = "permissions"

// tail's queues and the permission regex that covers them.
const (
	tailQueuePrefix  = brokerapi.TailQueuePrefix
	tailQueuePattern = brokerapi.TailQueuePattern
)

// The management API cannot tell a user's permissions to anyone but an
// administrator (RabbitMQ 3.10 answers /api/permissions/…,
// /api/users/<name>/permissions and /api/vhosts/<vhost>/permissions with
// 401 "Not administrator user" to the monitoring, management and
// policymaker tags), and the relay's user is the one that matters. So
// check asks the broker as the relay's user, with AMQP methods whose
// permission check comes before anything they could change, aimed at a
// queue or exchange with a random name that cannot exist: the broker
// checks the permission, then fails to find the object and refuses with
// 404, or accepts a deletion of nothing. None of them publishes: a publish
// is the only way to reach the relay's exchange's queues, and the probes
// never send one. Each probe has a channel of its own, since a refusal
// closes it.

// probeName is a name no queue or exchange has: name + 128 random bits.
func probeName(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// probe runs one AMQP method on a channel of its own and returns its
// error. A channel that cannot be opened is the error.
func probe(conn *amqp.Connection, do func(ch *amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open a channel: %w", err)
	}
	err = do(ch)
	if err == nil {
		_ = ch.Close()
	}
	return err
}

// refusedOn reports whether err is a 403 that names the resource kind
// ("exchange" or "queue") name: RabbitMQ says "access to exchange 'x' in
// vhost 'v' refused for user 'u'".
func refusedOn(err error, kind, name string) bool {
	var aerr *amqp.Error
	return errors.As(err, &aerr) && aerr.Code == amqp.AccessRefused && strings.Contains(aerr.Reason, fmt.Sprintf("access to %s '%s'", kind, name))
}

func isNotFound(err error) bool {
	var aerr *amqp.Error
	return errors.As(err, &aerr) && aerr.Code == amqp.NotFound
}

// probeWrite asks whether the user may publish to exchange: exchange.bind
// with exchange as the destination needs write on it, and the broker
// checks that first; the source is an exchange that does not exist, so no
// binding can be made (404, or 403 for read on that source: either means
// write was granted). Binding into the exchange never routes its messages
// anywhere: the exchange is the destination, not the source.
func probeWrite(conn *amqp.Connection, exchange string) (bool, error) {
	src := probeName("cdcrelay.check.nosuch-")
	err := probe(conn, func(ch *amqp.Channel) error {
		return ch.ExchangeBind(exchange, "cdcrelay-check", src, false, nil)
	})
	switch {
	case err == nil:
		// Only a broker that binds a source it does not have gets here:
		// undo it, and say nothing was learnt.
		_ = probe(conn, func(ch *amqp.Channel) error { return ch.ExchangeUnbind(exchange, "cdcrelay-check", src, false, nil) })
		return false, errors.New("the broker accepted a binding from an exchange that does not exist")
	case isNotFound(err), refusedOn(err, "exchange", src):
		return true, nil
	case refusedOn(err, "exchange", exchange):
		return false, nil
	}
	return false, err
}

// checkWritePermission is the Error finding for a user that may not
// publish to exchange (variable names it): the relay's first publish
// there would close its channel with 403 ACCESS_REFUSED, restarting the
// session again and again. A probe without a verdict is a warning that
// says how to look.
func checkWritePermission(conn *amqp.Connection, uri amqp.URI, exchange, variable string) Finding {
	ok, err := probeWrite(conn, exchange)
	switch {
	case err != nil:
		return Finding{Check: checkPermissions, Severity: Warn,
			Message: fmt.Sprintf("could not check user %s's write permission on exchange %q: %v; not checked", uri.Username, exchange, err),
			Remedy:  fmt.Sprintf("rabbitmqctl list_user_permissions %s shows it: the write pattern for vhost %s must match %s", uri.Username, uri.Vhost, exchange)}
	case ok:
		return Finding{Check: checkPermissions, Message: fmt.Sprintf("user %s may publish to exchange %q (write permission on vhost %q)", uri.Username, exchange, uri.Vhost)}
	}
	return Finding{Check: checkPermissions, Severity: Error,
		Message: fmt.Sprintf("user %s may not publish to exchange %q (%s): it has no write permission on it in vhost %q, so the relay's first publish fails with 403 ACCESS_REFUSED and its session restarts, again and again", uri.Username, exchange, variable, uri.Vhost),
		Remedy: fmt.Sprintf("add the exchange to the user's write pattern: rabbitmqctl list_user_permissions %s shows the patterns; set_permissions replaces all three, so keep the others, e.g. rabbitmqctl set_permissions -p %s %s '<configure>' '<write>|^%s$' '<read>'",
			uri.Username, uri.Vhost, uri.Username, regexp.QuoteMeta(exchange))}
}

// checkTailPermissions tells whether the user can run `cdcrelay tail`,
// which declares an exclusive queue named cdcrelay.tail.…, binds it to the
// relay's exchange and consumes from it: configure and write on the queue,
// read on the queue and on the exchange. Three probes on a queue name
// under that prefix that no queue has: queue.delete (configure, checked
// first; deleting a queue that is not there deletes nothing, and if_unused
// and if_empty are set all the same), queue.bind (write on the queue, then
// read on the exchange, then 404 for the missing queue: no binding is
// made) and basic.get (read, then 404: nothing to get). tail is a
// diagnostic, not the relay: a missing permission is a warning.
func checkTailPermissions(conn *amqp.Connection, uri amqp.URI, exchange string) Finding {
	q := probeName(tailQueuePrefix + "check-")
	var missing []string
	var unknown []string
	verdict := func(what string, err error, refused func(error) bool) {
		switch {
		case err == nil, isNotFound(err):
		case refused(err):
			missing = append(missing, what)
		default:
			unknown = append(unknown, fmt.Sprintf("%s: %v", what, err))
		}
	}
	queueRefused := func(err error) bool { return refusedOn(err, "queue", q) }
	err := probe(conn, func(ch *amqp.Channel) error { _, err := ch.QueueDelete(q, true, true, false); return err })
	verdict(`configure on queues `+tailQueuePattern, err, queueRefused)
	err = probe(conn, func(ch *amqp.Channel) error { return ch.QueueBind(q, "cdcrelay-check", exchange, false, nil) })
	readExchange := fmt.Sprintf("read on exchange %q", exchange)
	switch {
	case err == nil:
		// Only a broker that binds a queue it does not have gets here:
		// undo it, and say nothing was learnt.
		_ = probe(conn, func(ch *amqp.Channel) error { return ch.QueueUnbind(q, "cdcrelay-check", exchange, nil) })
		unknown = append(unknown, "write on queues "+tailQueuePattern+" and "+readExchange+": the broker accepted a binding of a queue that does not exist")
	case isNotFound(err):
	case queueRefused(err):
		missing = append(missing, "write on queues "+tailQueuePattern)
		unknown = append(unknown, readExchange+" (the broker refused the queue first)")
	case refusedOn(err, "exchange", exchange):
		missing = append(missing, readExchange)
	default:
		unknown = append(unknown, fmt.Sprintf("write on queues %s and %s: %v", tailQueuePattern, readExchange, err))
	}
	err = probe(conn, func(ch *amqp.Channel) error {
		d, ok, err := ch.Get(q, false)
		if ok {
			_ = d.Reject(true) // a queue that cannot exist held a message: give it back
		}
		return err
	})
	verdict("read on queues "+tailQueuePattern, err, queueRefused)
	how := fmt.Sprintf("grant them (rabbitmqctl list_user_permissions %s shows the patterns; set_permissions replaces all three, so keep the others): rabbitmqctl set_permissions -p %s %s '<configure>|%s' '<write>|%s' '<read>|%s|^%s$', or run tail with a CDCRELAY_AMQP_URL of a user that has them",
		uri.Username, uri.Vhost, uri.Username, tailQueuePattern, tailQueuePattern, tailQueuePattern, regexp.QuoteMeta(exchange))
	switch {
	case len(missing) > 0:
		msg := fmt.Sprintf("user %s cannot run `cdcrelay tail` on exchange %q: it lacks %s (tail declares an exclusive queue %s…, binds it and consumes from it); the relay itself does not need them", uri.Username, exchange, strings.Join(missing, ", "), tailQueuePrefix)
		if len(unknown) > 0 {
			msg += "; not checked: " + strings.Join(unknown, "; ")
		}
		return Finding{Check: checkPermissions, Severity: Warn, Message: msg, Remedy: how}
	case len(unknown) > 0:
		return Finding{Check: checkPermissions, Severity: Warn,
			Message: fmt.Sprintf("could not check whether user %s may run `cdcrelay tail` on exchange %q: %s; not checked", uri.Username, exchange, strings.Join(unknown, "; ")),
			Remedy:  "tail needs configure, write and read on " + tailQueuePattern + " and read on the exchange; " + how}
	}
	return Finding{Check: checkPermissions, Message: fmt.Sprintf("user %s may run `cdcrelay tail` on exchange %q (configure, write and read on %s, read on the exchange)", uri.Username, exchange, tailQueuePattern)}
}
