package relay

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// maxUnknown bounds the relations remembered across sessions. Past it a
// new one is not remembered: its next session may end on it again (a
// retry, never a skip), which keeps invariant 9 at the cost of restarts.
const maxUnknown = 64

// rememberUnknown records the relation a session ended on as unknown, for
// the next session start to classify (classifyUnknown).
func (r *Relay) rememberUnknown(err error) {
	var unknown *wal.RelationUnknownError
	if !errors.As(err, &unknown) {
		return
	}
	if _, ok := r.unknown[unknown.OID]; ok || len(r.unknown) < maxUnknown {
		r.unknown[unknown.OID] = unknown.Name
	}
}

// classifyUnknown returns the foreign relations of this session, OID to
// name: those of the publication (foreign) and, from the catalog, those
// remembered as unknown that the publication no longer lists. One of the
// outbox's tree, or one gone from the catalog, is a fatal ErrPublication:
// its insert may be an outbox row, so the slot never passes it.
func (r *Relay) classifyUnknown(ctx context.Context, db *pgx.Conn, table slot.Relation, foreign []slot.Relation) (map[uint32]string, error) {
	known := make(map[uint32]string, len(foreign))
	for _, rel := range foreign {
		known[rel.OID] = rel.Qualified()
	}
	leftover := make(map[uint32]string)
	for oid, name := range r.unknown {
		if _, ok := known[oid]; !ok {
			leftover[oid] = name
		}
	}
	if len(leftover) == 0 {
		return known, nil
	}
	more, err := slot.ClassifyLeftovers(ctx, db, table, leftover)
	if err != nil {
		return nil, err
	}
	for _, rel := range more {
		known[rel.OID] = rel.Qualified()
	}
	return known, nil
}
