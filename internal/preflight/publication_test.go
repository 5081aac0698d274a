package preflight

import (
	"strings"
	"testing"
)

// TestSuggestPublications: a missing publication names those that already
// publish the table (a misspelt CDCRELAY_PUBLICATION), and its remedy
// offers the setting first; other findings, and a table nobody
// publishes, are left alone.
func TestSuggestPublications(t *testing.T) {
	tg := target{schema: "public", table: "event_outbox", publication: "cdcrelay_typo"}
	missing := func() []Finding {
		return []Finding{
			{Check: checkPublication, Severity: Error, Message: "publication cdcrelay_typo does not exist; role relay cannot create it", Remedy: "run `cdcrelay migrate` as the owner"},
			{Check: checkMapping, Severity: Error, Message: "publication cdcrelay_typo does not exist", Remedy: "r"},
		}
	}
	fs := suggestPublications(missing(), tg, []string{"cdcrelay_orders", "everything"})
	if !strings.HasSuffix(fs[0].Message, "; public.event_outbox is published by cdcrelay_orders, everything (did you mean CDCRELAY_PUBLICATION=cdcrelay_orders?)") ||
		fs[0].Remedy != "if cdcrelay_orders is the relay's, set CDCRELAY_PUBLICATION=cdcrelay_orders; otherwise run `cdcrelay migrate` as the owner" {
		t.Errorf("finding %+v", fs[0])
	}
	if fs[1].Remedy != "r" || strings.Contains(fs[1].Message, "did you mean") {
		t.Errorf("another check's finding changed: %+v", fs[1])
	}
	if fs := suggestPublications(missing(), tg, nil); strings.Contains(fs[0].Message, "did you mean") {
		t.Errorf("a suggestion with no publication of the table: %+v", fs[0])
	}
}
