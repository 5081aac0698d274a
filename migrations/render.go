package migrations

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// The migrations create the table and the publication of a
// config.Outbox (its real schema and table names, not quoted, and its
// publication; the other fields are not used).

// Default is what the files name: they stay plain SQL that a service can
// copy into its own migration tool.
var Default = config.Outbox{Schema: "public", Table: "event_outbox", Publication: "cdcrelay_outbox"}

// The files' conventions, which Render relies on (TestRenderLeavesNoDefault
// holds every file to them): the table is the word event_outbox, objects
// named after it start with event_outbox_, the publication is the word
// cdcrelay_outbox, a name used as a string literal is written
// 'event_outbox' or 'cdcrelay_outbox' (an object's name 'event_outbox_…',
// unqualified, as pg_class.relname holds it), and PL/pgSQL bodies are quoted $$.
var token = regexp.MustCompile(`'event_outbox(_[a-z0-9_]+)?'|'cdcrelay_outbox'|\$\$|\bevent_outbox(_[a-z0-9_]+)?\b|\bcdcrelay_outbox\b`)

// Render returns migration file name with the default names replaced by
// t's, each quoted: the table schema-qualified (so nothing depends on the
// search_path), objects named after the table renamed after t's table in
// its schema, and the publication. So `cdcrelay migrate` creates exactly
// the configured table and publication, never a stray public.event_outbox.
func Render(name string, t config.Outbox) (string, error) {
	raw, err := files.ReadFile(name)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", name, err)
	}
	table := pgx.Identifier{t.Schema, t.Table}.Sanitize()
	// A name may hold "$$", which would end a PL/pgSQL body early.
	dollar := "$cdcrelay$"
	for strings.Contains(t.Schema+t.Table+t.Publication, dollar) {
		dollar = "$x" + dollar[1:]
	}
	return token.ReplaceAllStringFunc(string(raw), func(tok string) string {
		switch {
		case tok == "'event_outbox'":
			return literal(table)
		case strings.HasPrefix(tok, "'event_outbox_"): // an object's name, as a string
			return literal(t.Table + strings.TrimSuffix(strings.TrimPrefix(tok, "'event_outbox"), "'"))
		case tok == "'cdcrelay_outbox'":
			return literal(t.Publication)
		case tok == "$$":
			return dollar
		case tok == "cdcrelay_outbox":
			return pgx.Identifier{t.Publication}.Sanitize()
		case tok == "event_outbox":
			return table
		}
		return pgx.Identifier{t.Table + strings.TrimPrefix(tok, "event_outbox")}.Sanitize() // event_outbox_…
	}), nil
}

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
