package relay

import (
	"context"
	"errors"
	"fmt"

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
	dbCfg, err := pgconnect.Config(r.cfg.DatabaseURL, nil)
	if err != nil {
		return nil, err
	}
	if dbCfg.ConnectTimeout == 0 {
		dbCfg.ConnectTimeout = connectTimeout
	}
	db, err := pgx.ConnectConfig(ctx, dbCfg)
	if err != nil {
		r.metrics.connectFailures.WithLabelValues("postgres").Inc()
		return nil, fmt.Errorf("connect to database: %w", pgerr.Connect(err))
	}
	return db, nil
}

// dial connects to the broker: the session's one connection to it.
func (r *Relay) dial(ctx context.Context) (*publish.Link, error) {
	tlsConfig, err := r.cfg.AMQPTLS()
	if err != nil {
		return nil, fmt.Errorf("broker TLS: %w", err)
	}
	link, err := publish.Dial(ctx, publish.DialOptions{
		URL: r.cfg.AMQPURL, Heartbeat: r.cfg.AMQPHeartbeat, TLS: tlsConfig,
		Exchanges: []string{r.cfg.Exchange, r.cfg.DeadLetterExchange},
		Name:      "cdcrelay " + r.cfg.Slot, Window: r.cfg.MaxInFlight, Channels: r.cfg.PublishChannels,
	})
	if err != nil {
		r.metrics.connectFailures.WithLabelValues("broker").Inc()
		return nil, err
	}
	r.metrics.connectedTo("broker")
	return link, nil
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
	cfg, err := pgconnect.ReplicationConfig(r.cfg.DatabaseURL, replicationParams)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["replication"] = "database"
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeout
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		r.metrics.connectFailures.WithLabelValues("postgres").Inc()
		return nil, fmt.Errorf("open replication connection: %w", pgerr.Connect(err))
	}
	r.metrics.connectedTo("postgres")
	return conn, nil
}

// startOnce sends START_REPLICATION once (see startReplication); a slot
// active for another process is returned as the server's error.
func (r *Relay) startOnce(ctx context.Context, conn *pgconn.PgConn) error {
	err := pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			"publication_names " + slot.PublicationNamesArg(r.cfg.Publication),
		},
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
