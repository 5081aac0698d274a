package publish

import (
	"encoding/json"
	"strings"
	"testing"
)

// oldEnvelope is the json.Unmarshal-based envelope reading envelopeOf
// replaced, kept verbatim as the oracle: the event type, the traceparent,
// and whether the payload decoded at all.
func oldEnvelope(payload []byte) (eventType, trace string, ok bool) {
	var env struct {
		EventType    string          `json:"event_type"`
		TraceContext json.RawMessage `json:"trace_context"`
	}
	if json.Unmarshal(payload, &env) != nil {
		return "", "", false
	}
	return env.EventType, oldTraceparent(env.TraceContext), true
}

func oldTraceparent(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return oldValidTraceparent(s)
	}
	var obj struct {
		Traceparent string `json:"traceparent"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		return oldValidTraceparent(obj.Traceparent)
	}
	return ""
}

func oldValidTraceparent(s string) string {
	parts := strings.Split(s, "-")
	if len(parts) < 4 || len(parts[0]) != 2 || len(parts[1]) != 32 || len(parts[2]) != 16 || len(parts[3]) != 2 {
		return ""
	}
	for _, p := range parts[:4] {
		for _, c := range p {
			if !strings.ContainsRune("0123456789abcdef", c) {
				return ""
			}
		}
	}
	return s
}

// tpEscaped is tp with its first dash written as a JSON unicode escape.
const tpEscaped = `00\u002d4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`

// envelopeCases are payloads with what the envelope gives: the type, the
// trace, whether json.Unmarshal accepts the payload (ok), and whether the
// scanner answers without falling back to encoding/json (fast).
var envelopeCases = []struct {
	name, payload string
	typ, trace    string
	ok, fast      bool
}{
	{name: "type only", payload: `{"event_type":"OrderPlaced"}`, typ: "OrderPlaced", ok: true, fast: true},
	{name: "bench payload", payload: benchPayload, typ: "OrderCreated", trace: tp, ok: true, fast: true},
	{name: "empty object", payload: `{}`, ok: true, fast: true},
	{name: "empty type", payload: `{"event_type":""}`, ok: true, fast: true},
	{name: "empty key", payload: `{"":1,"event_type":"T"}`, typ: "T", ok: true, fast: true},
	{name: "raw UTF-8 type", payload: `{"event_type":"Orderé"}`, typ: "Orderé", ok: true, fast: true},
	{name: "non-ASCII key", payload: `{"évent_type":"X","event_type":"T"}`, typ: "T", ok: true, fast: true},
	{name: "scalars", payload: `{"n":-1.5e+10,"m":true,"f":false,"z":null,"i":0,"E":2E-3,"event_type":"T"}`, typ: "T", ok: true, fast: true},

	// Names inside values are not members.
	{name: "names in a nested object", payload: `{"data":{"event_type":"Inner","trace_context":"` + tp + `"},"x":1}`, ok: true, fast: true},
	{name: "names in nested arrays", payload: `{"list":[{"event_type":"A"},["trace_context","event_type"]],"event_type":"Outer"}`, typ: "Outer", ok: true, fast: true},
	{name: "deep nesting with brackets in strings", payload: `{"a":[[[[{"b":"]]]}}"}]]]],"c":{"d":{"e":"{{["}},"event_type":"T"}`, typ: "T", ok: true, fast: true},
	{name: "names in a string with escaped quotes", payload: `{"note":"say \"event_type\": \"X\", \"trace_context\":1","event_type":"Real"}`, typ: "Real", ok: true, fast: true},
	{name: "escaped backslash before a quote", payload: `{"a":"\\","event_type":"T"}`, typ: "T", ok: true, fast: true},
	{name: "escaped backslash and quote", payload: `{"a":"\\\"event_type\":1","event_type":"T"}`, typ: "T", ok: true, fast: true},
	{name: "nested object with the type as the only key", payload: `{"x":{"event_type":1}}`, ok: true, fast: true},

	// Keys encoding/json matches that are not spelled exactly: fallback.
	{name: "escaped key", payload: `{"event\u005ftype":"Esc"}`, typ: "Esc", ok: true},
	{name: "escaped first letter", payload: `{"\u0065vent_type":"E","trace_context":"` + tp + `"}`, typ: "E", trace: tp, ok: true},
	{name: "escaped unrelated key", payload: `{"a\"b":1,"event_type":"T"}`, typ: "T", ok: true},
	{name: "case-variant type key", payload: `{"Event_Type":"C"}`, typ: "C", ok: true},
	{name: "case-variant keys, exact last", payload: `{"EVENT_TYPE":"C","event_type":"c"}`, typ: "c", ok: true},
	{name: "case-variant keys, variant last", payload: `{"event_type":"c","EVENT_TYPE":"C"}`, typ: "C", ok: true},
	{name: "case-variant trace key", payload: `{"Trace_Context":"` + tp + `"}`, trace: tp, ok: true},

	// Duplicates: encoding/json decodes each; null leaves a string as it was
	// but sets the raw trace context to null.
	{name: "duplicate type", payload: `{"event_type":"A","event_type":"B"}`, typ: "B", ok: true},
	{name: "duplicate type, null last", payload: `{"event_type":"A","event_type":null}`, typ: "A", ok: true},
	{name: "duplicate trace, null last", payload: `{"trace_context":"` + tp + `","trace_context":null}`, ok: true},
	{name: "duplicate trace, null first", payload: `{"trace_context":null,"trace_context":"` + tp + `"}`, trace: tp, ok: true},

	// Types.
	{name: "null members", payload: `{"event_type":null,"trace_context":null}`, ok: true, fast: true},
	{name: "number type drops the trace", payload: `{"event_type":1,"trace_context":"` + tp + `"}`},
	{name: "bool type", payload: `{"event_type":true}`},
	{name: "object type", payload: `{"event_type":{"a":"b"}}`},
	{name: "array type", payload: `{"event_type":["a"]}`},
	{name: "number trace", payload: `{"event_type":"T","trace_context":42}`, typ: "T", ok: true, fast: true},
	{name: "array trace", payload: `{"trace_context":["` + tp + `"]}`, ok: true, fast: true},
	{name: "bool trace", payload: `{"trace_context":false}`, ok: true, fast: true},
	{name: "object trace", payload: `{"trace_context":{"traceparent":"` + tp + `","tracestate":"x=y"}}`, trace: tp, ok: true, fast: true},
	{name: "object trace, nested traceparent", payload: `{"trace_context":{"inner":{"traceparent":"` + tp + `"}}}`, ok: true, fast: true},
	{name: "object trace, case-variant key", payload: `{"trace_context":{"TraceParent":"` + tp + `"}}`, trace: tp, ok: true, fast: true},
	{name: "object trace, number traceparent", payload: `{"trace_context":{"traceparent":7}}`, ok: true, fast: true},
	{name: "object trace, null traceparent", payload: `{"trace_context":{"traceparent":null}}`, ok: true, fast: true},
	{name: "object trace, duplicate traceparent", payload: `{"trace_context":{"traceparent":"` + tp + `","traceparent":null}}`, trace: tp, ok: true, fast: true},

	// Whitespace and escapes.
	{name: "whitespace everywhere", payload: " \n\t{ \r\"event_type\" \n:\t\"T\" , \"trace_context\" : { \"traceparent\" : \"" + tp + "\" } } \n", typ: "T", trace: tp, ok: true, fast: true},
	{name: "unicode escape in the type", payload: `{"event_type":"Order\u00e9"}`, typ: "Orderé", ok: true},
	{name: "surrogate pair in the type", payload: `{"event_type":"\ud83d\ude00"}`, typ: "😀", ok: true},
	{name: "lone surrogate in the type", payload: `{"event_type":"\ud800"}`, typ: "\ufffd", ok: true},
	{name: "invalid UTF-8 in the type", payload: "{\"event_type\":\"a\xffb\"}", typ: "a\ufffdb", ok: true},
	{name: "escaped dash in the trace", payload: `{"trace_context":"` + tpEscaped + `"}`, trace: tp, ok: true, fast: true},
	{name: "escaped fifth part of the trace", payload: `{"trace_context":"` + tp + `-\n"}`, trace: tp + "-\n", ok: true, fast: true},
	{name: "fifth part of the trace", payload: `{"trace_context":"` + tp + `-extra"}`, trace: tp + "-extra", ok: true, fast: true},
	{name: "invalid UTF-8 in the trace's fifth part", payload: "{\"trace_context\":\"" + tp + "-\xff\"}", trace: tp + "-\ufffd", ok: true, fast: true},
	{name: "upper-case trace", payload: `{"trace_context":"` + strings.ToUpper(tp) + `"}`, ok: true, fast: true},

	// Not an object.
	{name: "array", payload: `["event_type"]`},
	{name: "string", payload: `"event_type"`},
	{name: "number", payload: `42`},
	{name: "null", payload: `null`, ok: true},

	// Invalid JSON the scanner notices; encoding/json rejects it.
	{name: "empty", payload: ``},
	{name: "unterminated object", payload: `{"event_type":"T"`},
	{name: "unterminated array", payload: `{"a":[1,2`},
	{name: "unterminated string", payload: `{"a":"\`},
	{name: "missing value", payload: `{"event_type":}`},
	{name: "missing colon", payload: `{"a" 1}`},
	{name: "missing comma", payload: `{"a":1 "event_type":"T"}`},
	{name: "trailing comma", payload: `{"event_type":"T",}`},
	{name: "trailing data", payload: `{"event_type":"T"}}`},
	{name: "two objects", payload: `{"event_type":"T"} {}`},
	{name: "form feed is not whitespace", payload: "{\f\"event_type\":\"T\"}"},
	{name: "non-breaking space is not whitespace", payload: "{\u00a0\"event_type\":\"T\"}"},
	{name: "control character in the type", payload: "{\"event_type\":\"a\tb\"}"},
}

func TestEnvelope(t *testing.T) {
	for _, c := range envelopeCases {
		t.Run(c.name, func(t *testing.T) {
			typ, trace, ok := envelopeOf([]byte(c.payload))
			if string(typ) != c.typ || string(trace) != c.trace || ok != c.ok {
				t.Errorf("envelopeOf = %q, %q, %v; want %q, %q, %v", typ, trace, ok, c.typ, c.trace, c.ok)
			}
			if wt, wtr, wok := oldEnvelope([]byte(c.payload)); string(typ) != wt || string(trace) != wtr || ok != wok {
				t.Errorf("envelopeOf = %q, %q, %v; json.Unmarshal gives %q, %q, %v", typ, trace, ok, wt, wtr, wok)
			}
			if _, _, sure := scanEnvelope([]byte(c.payload)); sure != c.fast {
				t.Errorf("scanEnvelope sure = %v, want %v", sure, c.fast)
			}
		})
	}
}

func TestTraceparent(t *testing.T) {
	tests := []struct {
		raw, want string
		fast      bool
	}{
		{raw: ``, fast: true},
		{raw: `null`, fast: true},
		{raw: `"` + tp + `"`, want: tp, fast: true},
		{raw: `"` + tpEscaped + `"`, want: tp},
		{raw: `"` + tp + `-x"`, want: tp + "-x", fast: true},
		{raw: `"00-zz-11-01"`, fast: true},
		{raw: `""`, fast: true},
		{raw: `42`},
		{raw: `true`},
		{raw: `["` + tp + `"]`},
		{raw: `{}`, fast: true},
		{raw: `{"traceparent":"` + tp + `"}`, want: tp, fast: true},
		{raw: `{ "tracestate" : "a=b" , "traceparent" : "` + tp + `" }`, want: tp, fast: true},
		{raw: `{"traceparent":null}`, fast: true},
		{raw: `{"traceparent":"` + tpEscaped + `"}`, want: tp},
		{raw: `{"TRACEPARENT":"` + tp + `"}`, want: tp},
		{raw: `{"trace\u0070arent":"` + tp + `"}`, want: tp},
		{raw: `{"traceparent":"` + tp + `","traceparent":"00-x"}`},
		{raw: `{"traceparent":"` + tp + `","traceparent":null}`, want: tp},
		{raw: `{"traceparent":1}`},
		{raw: `{"traceparent":{"traceparent":"` + tp + `"}}`},
		{raw: `{"x":{"traceparent":"` + tp + `"}}`, fast: true},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			got := traceparent([]byte(tt.raw))
			if string(got) != tt.want {
				t.Errorf("traceparent = %q, want %q", got, tt.want)
			}
			if old := oldTraceparent(json.RawMessage(tt.raw)); string(got) != old {
				t.Errorf("traceparent = %q, json.Unmarshal gives %q", got, old)
			}
			if _, sure := scanTraceparent([]byte(tt.raw)); sure != tt.fast {
				t.Errorf("scanTraceparent sure = %v, want %v", sure, tt.fast)
			}
		})
	}
}

var traceparentCases = []struct {
	s     string
	valid bool
}{
	{tp, true},
	{tp + "-", true},
	{tp + "-extra-parts", true},
	{tp + "-\xff", true},
	{"ff-ffffffffffffffffffffffffffffffff-ffffffffffffffff-ff", true},
	{"", false},
	{"-", false},
	{"---", false},
	{tp + "x", false},
	{tp[:len(tp)-1], false},
	{strings.ToUpper(tp), false},
	{strings.Replace(tp, "4b", "4g", 1), false},
	{strings.Replace(tp, "-00f0", "-00f", 1) + "0", false},
	{"000-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1", false},
	{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\u00e9", false},
	{"00-4bf92f3577b34da6a3ce929d0e0e473\u00e9-00f067aa0ba902b7-01", false},
	{"00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01", false},
}

func TestValidTraceparent(t *testing.T) {
	for _, c := range traceparentCases {
		got := validTraceparent([]byte(c.s))
		want := ""
		if c.valid {
			want = c.s
		}
		if string(got) != want {
			t.Errorf("validTraceparent(%q) = %q, want %q", c.s, got, want)
		}
		if old := oldValidTraceparent(c.s); string(got) != old {
			t.Errorf("validTraceparent(%q) = %q, the strings.Split rule gives %q", c.s, got, old)
		}
	}
}

func TestFoldMatch(t *testing.T) {
	tests := []struct {
		key, name string
		want      bool
	}{
		{"event_type", "event_type", true},
		{"EVENT_TYPE", "event_type", true},
		{"Event_Type", "event_type", true},
		{"event-type", "event_type", false},
		{"event_typ", "event_type", false},
		{"event_types", "event_type", false},
		{"\u212a", "k", true}, // Kelvin sign folds to k, as in encoding/json
		{"\u017f", "s", true}, // long s folds to s
		{"\xff", "k", false},
		{"", "k", false},
	}
	for _, tt := range tests {
		if got := foldMatch([]byte(tt.key), tt.name); got != tt.want {
			t.Errorf("foldMatch(%q, %q) = %v, want %v", tt.key, tt.name, got, tt.want)
		}
	}
}

// FuzzEnvelope checks the scanner against the json.Unmarshal code it
// replaced, on every input json.Valid accepts (PostgreSQL or Check
// validated every payload that reaches it), and that nothing panics on any
// other input. Random bytes are rarely a valid object, so the input is also
// tried as a member value: skipped, and as the trace context.
func FuzzEnvelope(f *testing.F) {
	for _, c := range envelopeCases {
		f.Add([]byte(c.payload))
	}
	for _, c := range traceparentCases {
		f.Add([]byte(c.s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if got, want := validTraceparent(data), oldValidTraceparent(string(data)); string(got) != want {
			t.Fatalf("validTraceparent(%q) = %q, the strings.Split rule gives %q", data, got, want)
		}
		checkEnvelope(t, data)
		if got := traceparent(data); json.Valid(data) {
			if want := oldTraceparent(data); string(got) != want {
				t.Fatalf("traceparent(%q) = %q, json.Unmarshal gives %q", data, got, want)
			}
		}
		v := string(data)
		checkEnvelope(t, []byte(`{"x":`+v+`,"event_type":"T"}`))
		checkEnvelope(t, []byte(`{"event_type":"T","trace_context":`+v+`}`))
	})
}

// checkEnvelope compares envelopeOf with oldEnvelope when payload is valid
// JSON; on other input it only runs envelopeOf, which must not panic.
func checkEnvelope(t *testing.T, payload []byte) {
	typ, trace, ok := envelopeOf(payload)
	if !json.Valid(payload) {
		return
	}
	if wt, wtr, wok := oldEnvelope(payload); string(typ) != wt || string(trace) != wtr || ok != wok {
		t.Fatalf("envelopeOf(%q) = %q, %q, %v; json.Unmarshal gives %q, %q, %v", payload, typ, trace, ok, wt, wtr, wok)
	}
}
