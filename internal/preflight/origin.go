package preflight

import (
	"context"
	"fmt"
	"strings"

	"github.com/cdcrelay/cdcrelay/internal/config"
	"github.com/cdcrelay/cdcrelay/internal/pgcaps"
	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
)

// originFacts is what the mark-origin check reads.
type originFacts struct {
	setting string      // CDCRELAY_MARK_ORIGIN
	server  pgcaps.Caps // the server that decodes
	granted bool        // the role may use the origin functions (on the primary)
	others  []string
}

// origins reads the facts: the grants on the primary (s), the version
// (probed once per run) and the origins on the server that decodes (ss;
// the same catalog).
func origins(ctx context.Context, setting string, s, ss *session) (originFacts, error) {
	f := originFacts{setting: setting}
	var err error
	if f.server, err = ss.probe(ctx); err != nil {
		return f, err
	}
	if !f.server.OriginNone() {
		return f, nil
	}
	err = s.db.QueryRow(ctx, `SELECT has_function_privilege('pg_replication_origin_oid(text)', 'EXECUTE')
		AND has_function_privilege('pg_replication_origin_create(text)', 'EXECUTE')
		AND has_function_privilege('pg_replication_origin_session_setup(text)', 'EXECUTE')`).Scan(&f.granted)
	if err != nil {
		return f, err
	}
	_, f.others, err = pgconnect.OnlyRelayOrigins(ctx, ss.db)
	return f, err
}

// classifyOrigin says whether the marks' transactions are skipped by the
// walsender (CDCRELAY_MARK_ORIGIN) and, when not, what would turn it on.
func classifyOrigin(role string, f originFacts) Finding {
	fd := Finding{Check: checkOrigin}
	grant := fmt.Sprintf("GRANT EXECUTE ON FUNCTION pg_replication_origin_oid(text), pg_replication_origin_create(text), pg_replication_origin_session_setup(text) TO %s;", quoteIdent(role))
	switch {
	case f.setting == config.MarkOriginOff:
		fd.Message = "CDCRELAY_MARK_ORIGIN=off: the walsender decodes the janitor's marks and retention's deletes, and throws them away"
	case !f.server.OriginNone():
		fd.Message = "the walsender decodes the janitor's marks and throws them away: skipping them by replication origin needs PostgreSQL 16 or later"
	case !f.granted:
		fd.Message = fmt.Sprintf("off: role %s may not use replication origins, so the walsender decodes the janitor's marks and retention's deletes and throws them away (a cost on the primary under load, and disk spills for large batches); to turn it on: %s", role, grant)
	case len(f.others) > 0:
		fd.Severity = Warn
		fd.Message = fmt.Sprintf("the cluster has replication origins that are not a relay's (%s): the stream decodes every transaction, since one with such an origin may insert outbox rows", strings.Join(f.others, ", "))
		fd.Remedy = "nothing to do for correctness; drop origins that are no longer used to let the stream skip the marks again"
	default:
		fd.Message = "on: the janitor's marks and retention's deletes carry a replication origin, and the stream asks for origin 'none', so the walsender skips them undecoded"
	}
	return fd
}

// originCheck judges whether the marks' transactions carry an origin.
func originCheck(ctx context.Context, s *session) []Finding {
	f, err := origins(ctx, s.cfg.MarkOrigin, s, s.ss)
	if err != nil {
		return []Finding{failed(checkOrigin, "read the replication origins and their grants", err)}
	}
	return []Finding{classifyOrigin(s.t.role, f)}
}
