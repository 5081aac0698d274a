package relay

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// originVersion is the first server_version_num whose pgoutput takes the
// origin option.
const originVersion = 160000

// skipOrigins decides whether this session's stream asks pgoutput for
// origin 'none': the walsender then skips, before its reorder buffer,
// every transaction that carries a replication origin, which is what the
// janitor's marks and retention's deletes carry (CDCRELAY_MARK_ORIGIN,
// pgconnect.SetupOrigin). Only where every origin of the cluster is a
// relay's: a transaction with another origin (a subscription's apply
// worker, say) may insert outbox rows, which the stream must never skip.
// sdb is the server that decodes.
func (r *Relay) decideOrigins(ctx context.Context, sdb *pgx.Conn, server slot.Server) (bool, error) {
	if r.cfg.MarkOrigin == config.MarkOriginOff || server.Version < originVersion {
		return false, nil
	}
	only, others, err := pgconnect.OnlyRelayOrigins(ctx, sdb)
	if err != nil || only {
		return only, err
	}
	if key := strings.Join(others, ","); key != r.originsNoted {
		r.originsNoted = key
		r.log.Warn("the cluster has replication origins that are not a relay's: the stream decodes every transaction, the marks' too, so that none of their inserts is missed", "origins", key)
	}
	return false, nil
}
