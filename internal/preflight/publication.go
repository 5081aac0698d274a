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

func loadPublication(ctx context.Context, s *session) { s.pub, s.pubErr = s.publication(ctx, s.table) }

// publicationCheck judges the publication as the relay does.
func publicationCheck(_ context.Context, s *session) []Finding {
	if s.pubErr != nil {
		return []Finding{failed(checkPublication, "read publication "+s.t.publication, s.pubErr)}
	}
	return classifyPublication(s.t, s.table, s.pub)
}

// generatedCheck refuses, as the relay does, a mapped column pgoutput
// does not send.
func generatedCheck(_ context.Context, s *session) []Finding {
	if s.pubErr != nil { // publicationCheck said why
		return nil
	}
	return classifyGenerated(s.t, s.table, s.pub)
}
