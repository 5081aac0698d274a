package preflight

import (
	"context"
	"fmt"
	"strings"

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

// publicationCheck judges the publication as the relay does; a missing
// one names the publications that already publish the table, the usual
// cause being a misspelt CDCRELAY_PUBLICATION rather than a missing
// migration.
func publicationCheck(ctx context.Context, s *session) []Finding {
	if s.pubErr != nil {
		return []Finding{failed(checkPublication, "read publication "+s.t.publication, s.pubErr)}
	}
	fs := classifyPublication(s.t, s.table, s.pub)
	if !s.pub.Exists && s.table.kind != "" {
		var others []string
		// pg_publication_tables lists FOR ALL TABLES publications too;
		// the check's role may read it whatever its grants.
		err := s.db.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT pubname ORDER BY pubname), '{}') FROM pg_publication_tables WHERE schemaname = $1 AND tablename = $2`,
			s.t.schema, s.t.table).Scan(&others)
		if err == nil {
			fs = suggestPublications(fs, s.t, others)
		}
	}
	return fs
}

// suggestPublications adds to the missing publication's finding the
// publications that publish the table (others), as a "did you mean".
func suggestPublications(fs []Finding, t target, others []string) []Finding {
	if len(others) == 0 {
		return fs
	}
	missing := fmt.Sprintf("publication %s does not exist", t.publication)
	for i, f := range fs {
		if f.Check != checkPublication || !strings.HasPrefix(f.Message, missing) {
			continue
		}
		fs[i].Message += fmt.Sprintf("; %s is published by %s (did you mean CDCRELAY_PUBLICATION=%s?)", t.qualified(), strings.Join(others, ", "), others[0])
		fs[i].Remedy = fmt.Sprintf("if %s is the relay's, set CDCRELAY_PUBLICATION=%s; otherwise %s", others[0], others[0], f.Remedy)
	}
	return fs
}

// generatedCheck refuses, as the relay does, a mapped column pgoutput
// does not send.
func generatedCheck(_ context.Context, s *session) []Finding {
	if s.pubErr != nil { // publicationCheck said why
		return nil
	}
	return classifyGenerated(s.t, s.table, s.pub)
}
