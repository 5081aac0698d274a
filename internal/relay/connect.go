package relay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/pgerr"
	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// connectDB opens the normal connection to the service database.
func (r *Relay) connectDB(ctx context.Context) (*pgx.Conn, error) {
	db, err := pgconnect.Connect(ctx, r.cfg.DatabaseURL, "to database", pgconnect.Options{})
	if err != nil {
		r.metrics.connectFailures.WithLabelValues("postgres").Inc()
		return nil, err
	}
	return db, nil
}

// dial connects to the broker: the session's one connection to it, to the
// first node that answers in the rotation (brokerNodes).
func (r *Relay) dial(ctx context.Context) (*publish.Link, error) {
	tlsConfig, err := r.cfg.AMQPTLS()
	if err != nil {
		return nil, fmt.Errorf("broker TLS: %w", err)
	}
	nodes := r.broker.order(r.cfg.AMQPNodes())
	link, err := publish.Dial(ctx, publish.DialOptions{
		URLs: nodes, URL: r.cfg.AMQPURL, Heartbeat: r.cfg.AMQPHeartbeat, TLS: tlsConfig,
		Exchanges: []string{r.cfg.Exchange, r.cfg.DeadLetterExchange},
		Name:      "cdcrelay " + r.cfg.Slot, Window: r.cfg.MaxInFlight, Channels: r.cfg.PublishChannels,
	})
	if err != nil {
		r.broker.failed()
		r.metrics.connectFailures.WithLabelValues("broker").Inc()
		return nil, err
	}
	if r.broker.connected(link.NodeIndex(), link.Node()) {
		r.metrics.brokerNodeSwitches.Inc()
	}
	r.metrics.connectedTo("broker")
	r.log.Info("connected to broker node", "node", link.Node(), "nodes", len(nodes))
	return link, nil
}

// brokerNodes rotates the sessions over the broker nodes of
// CDCRELAY_AMQP_URL, as the Java client and libpq's load_balance_hosts do:
// shuffled once, so that replicas spread over the cluster, then each
// session starts with the node after the previous session's. A session
// ends only by failure (or stop), and the node it used may be the one that
// failed: starting the next on the same node would wait out a dead node's
// connection timeout at every restart. The zero value is ready; it is
// touched by the Run goroutine only (sessions run one at a time).
type brokerNodes struct {
	shuffled []string // the configured nodes, in this process's order
	next     int      // where the next session starts in shuffled
	last     string   // host:port of the previous session's node
}

// order returns the nodes in the order the next session tries them.
func (b *brokerNodes) order(nodes []string) []string {
	if b.shuffled == nil {
		b.shuffled = slices.Clone(nodes)
		rand.Shuffle(len(b.shuffled), func(i, j int) { b.shuffled[i], b.shuffled[j] = b.shuffled[j], b.shuffled[i] })
	}
	n := len(b.shuffled)
	if n == 0 {
		return nil
	}
	return append(slices.Clone(b.shuffled[b.next%n:]), b.shuffled[:b.next%n]...)
}

// connected records that the session connected to the node at index i of
// the last order, at addr, and reports whether that is another node than
// the previous session's.
func (b *brokerNodes) connected(i int, addr string) bool {
	if n := len(b.shuffled); n > 0 {
		b.next = (b.next + i + 1) % n
	}
	switched := b.last != "" && addr != b.last
	b.last = addr
	return switched
}

// failed records that no node answered: the next session starts one node
// further, so that a node that hangs rather than refuses is not always
// the first to be waited for.
func (b *brokerNodes) failed() {
	if n := len(b.shuffled); n > 0 {
		b.next = (b.next + 1) % n
	}
}

// replicationParams are set on the replication connection unless the URL
// sets them.
var replicationParams = map[string]string{"statement_timeout": "0", "idle_in_transaction_session_timeout": "0"}

// connectReplication opens the replication connection.
func (r *Relay) connectReplication(ctx context.Context) (*pgconn.PgConn, error) {
	// A slot created with an exported snapshot leaves this connection in a
	// transaction until the backlog is published (adoption); slot creation
	// itself waits for every open transaction. A role's timeouts must end
	// neither: the relay reports what it waits for instead.
	url := r.cfg.DatabaseURL
	if r.cfg.ReplicationURL != "" {
		url = r.cfg.ReplicationURL // the slot is on a standby (standby.go)
	}
	conn, err := pgconnect.ConnectReplication(ctx, url, "for replication", pgconnect.Options{Params: replicationParams})
	if err != nil {
		r.metrics.connectFailures.WithLabelValues("postgres").Inc()
		var ce *pgconn.ConnectError
		role := ""
		if errors.As(err, &ce) {
			role = ce.Config.User
		}
		return nil, replicationDenied(err, role)
	}
	r.metrics.connectedTo("postgres")
	return conn, nil
}

// startOnce sends START_REPLICATION once (see startReplication); a slot
// active for another process is returned as the server's error.
func (r *Relay) startOnce(ctx context.Context, conn *pgconn.PgConn) error {
	args := []string{
		"proto_version '1'",
		"publication_names " + slot.PublicationNamesArg(r.cfg.Publication),
	}
	if r.skipOrigins {
		args = append(args, "origin 'none'") // the marks' transactions (origin.go)
	}
	err := pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication, PluginArgs: args,
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerr.ObjectInUse {
		return err
	}
	if err != nil {
		return fmt.Errorf("start replication on slot %s: %w", r.cfg.Slot, err)
	}
	return nil
}
