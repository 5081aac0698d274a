package config

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// maxIdentBytes is the longest identifier PostgreSQL keeps (NAMEDATALEN-1);
// it would silently truncate a longer one, so the relay refuses it.
const maxIdentBytes = 63

// ParseIdent reads one SQL identifier the way PostgreSQL does and returns
// its real name: a quoted part ("Outbox Events", with "" for a quote) is
// taken as written, an unquoted one is folded to lower case.
func ParseIdent(s string) (string, error) {
	parts, err := parseName(s)
	if err != nil {
		return "", err
	}
	if len(parts) != 1 {
		return "", fmt.Errorf("%q: want one identifier (quote it if it contains a dot: \"a.b\")", s)
	}
	return parts[0], nil
}

// SplitTable reads "table" or "schema.table" (schema defaults to public)
// with PostgreSQL's identifier rules and returns the real, unquoted names:
// `"Billing"."Outbox Events"` is schema Billing, table Outbox Events, and
// `Orders.Event_Outbox` is orders.event_outbox. Callers quote them again
// with pgx.Identifier.
func SplitTable(s string) (schema, table string, err error) {
	parts, err := parseName(s)
	if err != nil {
		return "", "", err
	}
	switch len(parts) {
	case 1:
		return "public", parts[0], nil
	case 2:
		return parts[0], parts[1], nil
	}
	return "", "", fmt.Errorf("%q: want table or schema.table (quote a part that contains a dot: \"a.b\")", s)
}

// parseName splits a dotted name into its identifiers.
func parseName(s string) ([]string, error) {
	in := strings.TrimSpace(s)
	if in == "" {
		return nil, errors.New("must not be empty")
	}
	if !utf8.ValidString(in) {
		return nil, fmt.Errorf("%q is not valid UTF-8", s)
	}
	var parts []string
	for {
		part, rest, err := nextIdent(in)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
		if len(part) > maxIdentBytes {
			return nil, fmt.Errorf("%q: identifier %q is %d bytes; PostgreSQL keeps at most %d", s, part, len(part), maxIdentBytes)
		}
		parts = append(parts, part)
		if rest == "" {
			return parts, nil
		}
		if rest[0] != '.' {
			return nil, fmt.Errorf("%q: unexpected %q after %q (quote names with spaces or capitals: \"My Table\")", s, rest, part)
		}
		in = rest[1:]
	}
}

// nextIdent reads one identifier from the start of s and returns it with
// the text after it.
func nextIdent(s string) (ident, rest string, err error) {
	if s == "" {
		return "", "", errors.New("empty identifier (nothing before or after a dot)")
	}
	if s[0] == '.' {
		return "", "", errors.New("empty identifier (nothing before or after a dot)")
	}
	if s[0] == '"' {
		return quotedIdent(s)
	}
	end := 0
	for end < len(s) && identByte(s[end], end == 0) {
		end++
	}
	if end == 0 {
		return "", "", fmt.Errorf("an identifier cannot start with %q (unquoted names start with a letter or _; quote others)", firstRune(s))
	}
	return foldASCII(s[:end]), s[end:], nil
}

// quotedIdent reads "…" with "" standing for one quote.
func quotedIdent(s string) (ident, rest string, err error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		if s[i] != '"' {
			if s[i] == 0 {
				return "", "", errors.New("an identifier cannot contain a NUL byte")
			}
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '"' {
			b.WriteByte('"')
			i++
			continue
		}
		if b.Len() == 0 {
			return "", "", errors.New(`a quoted identifier cannot be empty ("")`)
		}
		return b.String(), s[i+1:], nil
	}
	return "", "", errors.New("unterminated quoted identifier")
}

// identByte reports whether c may appear in an unquoted identifier:
// letters (any non-ASCII byte counts, as in PostgreSQL), _, and after the
// first, digits and $.
func identByte(c byte, first bool) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_', c >= 0x80:
		return true
	case c >= '0' && c <= '9', c == '$':
		return !first
	}
	return false
}

// foldASCII lowers A-Z only, as PostgreSQL folds unquoted identifiers in a
// UTF-8 database.
func foldASCII(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

func firstRune(s string) string {
	r, _ := utf8.DecodeRuneInString(s)
	return string(r)
}
