package preflight

import (
	"context"

	"github.com/cdcrelay/cdcrelay/internal/slot"
)

// publication reads the publication as the relay does (slot.ReadPublication),
// and whether this role could create it were it missing.
func (s *session) publication(ctx context.Context, tf tableFacts) (slot.PublicationFacts, error) {
	p, err := slot.ReadPublication(ctx, s.db, s.t.publication, tf.facts(s.t))
	p.CanCreate = s.canCreatePublication
	return p, err
}
