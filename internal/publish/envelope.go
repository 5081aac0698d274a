package publish

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// Reading the envelope is on the per-event path, and json.Unmarshal into a
// struct costs several microseconds and a dozen allocations for a payload
// of a few hundred bytes. The relay needs two top-level members, so it walks
// the top level of the object once, skipping every other value by bracket
// depth, and reads the members in place.
//
// The contract is strict: envelopeOf gives exactly what json.Unmarshal into
// envelope followed by decoding the trace context gives (FuzzEnvelope checks
// this). Whenever the fast path cannot be sure of that — an escaped key, a
// key that only matches case-insensitively, a duplicate, a value that needs
// decoding, anything not shaped as expected — it falls back to
// encoding/json instead of imitating its rules.

// envelope is the part of a payload the relay looks at. It is only decoded
// on the fallback path.
type envelope struct {
	EventType    string          `json:"event_type"`
	TraceContext json.RawMessage `json:"trace_context"`
}

// envelopeOf returns the event type and the valid W3C traceparent the
// payload's envelope carries, nil when absent. ok is false when the payload
// is not an envelope at all (json.Unmarshal into envelope fails); the caller
// then uses neither. The slices may alias payload.
func envelopeOf(payload []byte) (eventType, trace []byte, ok bool) {
	if eventType, rawTrace, sure := scanEnvelope(payload); sure {
		return eventType, traceparent(rawTrace), true
	}
	return decodeEnvelope(payload)
}

// scanEnvelope is the fast path of envelopeOf: the event type and the raw
// trace context, read in place. sure is false when only encoding/json can
// tell what they are.
func scanEnvelope(payload []byte) (eventType, rawTrace []byte, sure bool) {
	var raw [2][]byte
	if !lookupMembers(payload, []string{"event_type", "trace_context"}, raw[:]) {
		return nil, nil, false
	}
	// A non-string event_type fails json.Unmarshal as a whole; the fallback
	// reproduces that.
	eventType, sure = plainStringOrNull(raw[0])
	return eventType, raw[1], sure
}

// decodeEnvelope is the slow path of envelopeOf, with encoding/json's own
// rules for case folding, duplicates, escapes and type errors.
func decodeEnvelope(payload []byte) (eventType, trace []byte, ok bool) {
	var env envelope
	if json.Unmarshal(payload, &env) != nil {
		return nil, nil, false
	}
	if env.EventType != "" {
		eventType = []byte(env.EventType)
	}
	return eventType, traceparent(env.TraceContext), true
}

// traceparent accepts a trace context given as the traceparent string itself
// or as an object with a "traceparent" member, and returns it when it is a
// valid W3C traceparent. raw is the JSON text of the trace context.
func traceparent(raw []byte) []byte {
	if s, sure := scanTraceparent(raw); sure {
		return validTraceparent(s)
	}
	return decodeTraceparent(raw)
}

// scanTraceparent is the fast path of traceparent: the candidate string,
// read in place, for the forms that need no decoding. sure is false for
// everything else (escapes, case-variant or duplicate keys, other types).
func scanTraceparent(raw []byte) (s []byte, sure bool) {
	switch {
	case len(raw) == 0 || isNull(raw):
		return nil, true // json.Unmarshal of null into a string leaves it empty
	case raw[0] == '"':
		return plainString(raw)
	case raw[0] == '{':
		var member [1][]byte
		if lookupMembers(raw, []string{"traceparent"}, member[:]) {
			return plainStringOrNull(member[0])
		}
	}
	return nil, false
}

// decodeTraceparent is the slow path of traceparent: the string form, else
// the object form, decoded by encoding/json.
func decodeTraceparent(raw []byte) []byte {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return validTraceparent([]byte(s))
	}
	var obj struct {
		Traceparent string `json:"traceparent"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		return validTraceparent([]byte(obj.Traceparent))
	}
	return nil
}

// validTraceparent returns s if it has the W3C shape
// version-traceid-parentid-flags (2-32-16-2 lowercase hex digits), else
// nil. Like the strings.Split rule it replaces, it accepts further
// "-"-separated parts after the flags and returns them too.
func validTraceparent(s []byte) []byte {
	const size = 2 + 1 + 32 + 1 + 16 + 1 + 2
	if len(s) < size || (len(s) > size && s[size] != '-') {
		return nil
	}
	if s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return nil
	}
	// Hex digits are never '-', so these also fix the part lengths.
	if !lowerHex(s[0:2]) || !lowerHex(s[3:35]) || !lowerHex(s[36:52]) || !lowerHex(s[53:55]) {
		return nil
	}
	return s
}

func lowerHex(b []byte) bool {
	for _, c := range b {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// lookupMembers finds the top-level members of the JSON object data whose
// keys are exactly names[i] and stores their raw values in values[i] (left
// nil when absent). It reports false when it cannot be sure that this is
// what encoding/json would decode into fields named by names: data is not
// one object, a key has escapes or matches a name only case-insensitively,
// a name occurs twice, or the text is malformed where it looked.
func lookupMembers(data []byte, names []string, values [][]byte) bool {
	s, ok := openObject(data)
	if !ok {
		return false
	}
	for {
		key, value, st := s.next()
		switch st {
		case stepEnd:
			return true
		case stepUnsure:
			return false
		}
		if bytes.IndexByte(key, '\\') >= 0 {
			return false // may decode to a name
		}
		for i, name := range names {
			switch {
			case string(key) == name:
				if values[i] != nil {
					return false // encoding/json merges duplicates its own way
				}
				values[i] = value
			case foldMatch(key, name):
				return false // encoding/json matches keys case-insensitively
			}
		}
	}
}

// foldMatch reports whether key equals name under Unicode simple case
// folding, the rule by which encoding/json matches a key to a field when no
// field has the exact name. Non-ASCII runes count: "K" (Kelvin) folds to k.
func foldMatch(key []byte, name string) bool {
	// A rune folding to an ASCII letter is at most utf8.UTFMax bytes long;
	// the length test keeps the common case free of the rune decoding.
	if len(key) < len(name) || len(key) > utf8.UTFMax*len(name) {
		return false
	}
	return bytes.EqualFold(key, []byte(name))
}

// plainStringOrNull reads a member value that encoding/json would decode
// into a Go string without help: absent or null (left empty) or a string
// without escapes. sure is false for anything else.
func plainStringOrNull(raw []byte) (s []byte, sure bool) {
	if raw == nil || isNull(raw) {
		return nil, true
	}
	return plainString(raw)
}

// plainString returns the contents of the JSON string raw if they need no
// decoding: no escapes, no control characters (invalid JSON), valid UTF-8
// (encoding/json replaces invalid bytes with U+FFFD).
func plainString(raw []byte) (s []byte, sure bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, false
	}
	s = raw[1 : len(raw)-1]
	ascii := true
	for _, c := range s {
		switch {
		case c == '\\' || c == '"' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	if !ascii && !utf8.Valid(s) {
		return nil, false
	}
	return s, true
}

func isNull(raw []byte) bool {
	return string(raw) == "null"
}

// step is what objectScanner.next found.
type step int

const (
	stepMember step = iota // a member, returned
	stepEnd                // the closing brace, with only whitespace after it
	stepUnsure             // anything else: the caller must not trust the scan
)

// objectScanner walks the top-level members of one JSON object without
// decoding or allocating. It relies on the text being valid JSON for what it
// skips (nested values and scalars are only delimited, not checked), but
// never reads out of bounds or loops on invalid input.
type objectScanner struct {
	data    []byte
	pos     int // just after the '{' or the last member's value
	members int
}

// openObject starts a scan of data, which must be a JSON object.
func openObject(data []byte) (objectScanner, bool) {
	i := skipSpace(data, 0)
	if i == len(data) || data[i] != '{' {
		return objectScanner{}, false
	}
	return objectScanner{data: data, pos: i + 1}, true
}

// next returns the next member: the raw key between its quotes (escapes not
// decoded) and the raw text of its value.
func (s *objectScanner) next() (key, value []byte, st step) {
	d := s.data
	i := skipSpace(d, s.pos)
	if i == len(d) {
		return nil, nil, stepUnsure
	}
	switch {
	case d[i] == '}':
		// Unmarshal rejects anything but whitespace after the value.
		if skipSpace(d, i+1) != len(d) {
			return nil, nil, stepUnsure
		}
		return nil, nil, stepEnd
	case s.members > 0 && d[i] != ',':
		return nil, nil, stepUnsure
	case s.members > 0:
		i = skipSpace(d, i+1)
	}
	if i == len(d) || d[i] != '"' {
		return nil, nil, stepUnsure
	}
	keyEnd := stringEnd(d, i)
	if keyEnd < 0 {
		return nil, nil, stepUnsure
	}
	key = d[i+1 : keyEnd-1]
	i = skipSpace(d, keyEnd)
	if i == len(d) || d[i] != ':' {
		return nil, nil, stepUnsure
	}
	i = skipSpace(d, i+1)
	end := valueEnd(d, i)
	if end < 0 {
		return nil, nil, stepUnsure
	}
	s.pos, s.members = end, s.members+1
	return key, d[i:end], stepMember
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace, or len(d).
func skipSpace(d []byte, i int) int {
	for i < len(d) {
		switch d[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// valueEnd returns the index just after the JSON value starting at d[i], or
// -1 when it does not end.
func valueEnd(d []byte, i int) int {
	if i >= len(d) {
		return -1
	}
	switch d[i] {
	case '"':
		return stringEnd(d, i)
	case '{', '[':
		return containerEnd(d, i)
	}
	return scalarEnd(d, i)
}

// stringEnd returns the index just after the JSON string whose opening quote
// is d[i], or -1 when it does not end.
func stringEnd(d []byte, i int) int {
	for j := i + 1; j < len(d); j++ {
		switch d[j] {
		case '"':
			return j + 1
		case '\\':
			j++ // the escaped byte cannot end the string
		}
	}
	return -1
}

// containerEnd returns the index just after the object or array that opens
// at d[i], or -1 when it does not end. Brackets inside strings do not count;
// bracket kinds are not matched, valid JSON pairs them.
func containerEnd(d []byte, i int) int {
	depth := 0
	for j := i; j < len(d); j++ {
		switch d[j] {
		case '"':
			end := stringEnd(d, j)
			if end < 0 {
				return -1
			}
			j = end - 1
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return j + 1
			}
		}
	}
	return -1
}

// scalarEnd returns the index just after the number or literal (true,
// false, null) at d[i], or -1 when there is none.
func scalarEnd(d []byte, i int) int {
	j := i
	for j < len(d) && scalarByte(d[j]) {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// scalarByte reports whether c can occur in a JSON number or literal.
func scalarByte(c byte) bool {
	return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'E'
}
