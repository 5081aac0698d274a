package preflight

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// syncStandbyMatches reports which entry of a synchronous_standby_names
// value would select a walsender with application_name app ("" if none).
// It follows PostgreSQL's grammar:
//
//	name [, ...]
//	[FIRST] num ( name [, ...] )
//	ANY num ( name [, ...] )
//
// where a name is an identifier, a double-quoted string or *, and names are
// compared case-insensitively (as SyncRepGetStandbyPriority does), * (quoted
// or not) matching every standby.
func syncStandbyMatches(setting, app string) (string, error) {
	toks, err := syncTokens(setting)
	if err != nil {
		return "", err
	}
	if len(toks) == 0 {
		return "", nil
	}
	isNum := func(t syncToken) bool {
		return !t.quoted && t.text != "" && strings.IndexFunc(t.text, func(r rune) bool { return !unicode.IsDigit(r) }) < 0
	}
	// Strip the [FIRST|ANY] num ( … ) frame.
	i := 0
	if len(toks) > 2 && !toks[0].quoted && (strings.EqualFold(toks[0].text, "first") || strings.EqualFold(toks[0].text, "any")) && isNum(toks[1]) && toks[2].text == "(" {
		i = 1
	}
	if len(toks) > i+1 && isNum(toks[i]) && toks[i+1].text == "(" {
		if toks[len(toks)-1].text != ")" || toks[len(toks)-1].quoted {
			return "", errors.New("missing closing parenthesis")
		}
		toks = toks[i+2 : len(toks)-1]
	}
	expectName := true
	for _, t := range toks {
		punct := !t.quoted && (t.text == "," || t.text == "(" || t.text == ")")
		switch {
		case expectName && punct:
			return "", fmt.Errorf("unexpected %q", t.text)
		case !expectName && t.text != ",":
			return "", fmt.Errorf("unexpected %q after a name", t.text)
		case expectName:
			if t.text == "*" || strings.EqualFold(t.text, app) { // PostgreSQL treats a quoted "*" alike
				return t.raw, nil
			}
		}
		expectName = !expectName
	}
	if expectName {
		return "", errors.New("list ends without a name")
	}
	return "", nil
}

type syncToken struct {
	text   string // the name (unquoted) or punctuation
	raw    string // as written
	quoted bool
}

func syncTokens(s string) ([]syncToken, error) {
	var toks []syncToken
	for i := 0; i < len(s); {
		c := s[i]
		switch c {
		case ' ', '\t', '\n', '\r':
			i++
		case ',', '(', ')', '*':
			toks = append(toks, syncToken{text: string(c), raw: string(c)})
			i++
		case '"':
			var b strings.Builder
			j := i + 1
			for {
				if j >= len(s) {
					return nil, errors.New("unterminated quoted name")
				}
				if s[j] == '"' {
					if j+1 < len(s) && s[j+1] == '"' {
						b.WriteByte('"')
						j += 2
						continue
					}
					break
				}
				b.WriteByte(s[j])
				j++
			}
			toks = append(toks, syncToken{text: b.String(), raw: s[i : j+1], quoted: true})
			i = j + 1
		default:
			j := i
			for j < len(s) && !strings.ContainsRune(" \t\n\r,()*\"", rune(s[j])) {
				j++
			}
			toks = append(toks, syncToken{text: s[i:j], raw: s[i:j]})
			i = j
		}
	}
	return toks, nil
}
