package publish

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// numberText is the JSON text of a header value numberValue made from a
// JSON number: what a consumer writes back to recover the stored number.
// ok is false for a value numberValue never makes from a number.
func numberText(v any) (text string, ok bool) {
	switch x := v.(type) {
	case int64:
		return strconv.FormatInt(x, 10), true
	case string:
		return x, true
	case Decimal:
		return numberText(amqp.Decimal{Scale: x.Scale, Value: x.Value})
	case amqp.Decimal:
		if x.Scale == 0 {
			return "", false
		}
		digits := strconv.FormatInt(int64(x.Value), 10)
		sign := ""
		if x.Value < 0 {
			sign, digits = "-", digits[1:]
		}
		if pad := int(x.Scale) + 1 - len(digits); pad > 0 {
			digits = strings.Repeat("0", pad) + digits
		}
		cut := len(digits) - int(x.Scale)
		return sign + digits[:cut] + "." + digits[cut:], true
	default:
		return "", false
	}
}

// headerNumberCases are the mapping of docs/messages.md ("Header values").
var headerNumberCases = []struct {
	text string
	want any
}{
	{"0", int64(0)},
	{"-1", int64(-1)},
	{"9007199254740993", int64(9007199254740993)}, // 2^53 + 1: a double rounds it
	{"1234567890123456789", int64(1234567890123456789)},
	{"9223372036854775807", int64(9223372036854775807)},
	{"-9223372036854775808", int64(-9223372036854775808)},
	{"9223372036854775808", "9223372036854775808"}, // beyond int64
	{"123456789012345678901234567890", "123456789012345678901234567890"},
	{"12.50", Decimal{Scale: 2, Value: 1250}}, // the trailing zero is kept
	{"0.05", Decimal{Scale: 2, Value: 5}},
	{"-0.5", Decimal{Scale: 1, Value: -5}},
	{"0.0", Decimal{Scale: 1, Value: 0}},
	{"214748364.7", Decimal{Scale: 1, Value: 2147483647}},
	{"-214748364.8", Decimal{Scale: 1, Value: -2147483648}},
	{"214748364.8", "214748364.8"}, // digits beyond int32
	{"3.14159265358979323846", "3.14159265358979323846"},
	{"1e400", "1e400"}, // beyond float64
	{"1E5", "1E5"},
	{"1.5e-3", "1.5e-3"},
	{"-0", "-0"}, // neither int64 nor decimal keeps the sign of zero
	{"-0.00", "-0.00"},
	{"0." + strings.Repeat("0", 300) + "1", "0." + strings.Repeat("0", 300) + "1"}, // scale above 255
}

func TestHeaderNumbers(t *testing.T) {
	for _, c := range headerNumberCases {
		got := numberValue(c.text)
		if got != c.want {
			t.Errorf("numberValue(%s) = %#v, want %#v", c.text, got, c.want)
		}
		if back, ok := numberText(got); !ok || back != c.text {
			t.Errorf("numberText(%#v) = %q, %v; want %q", got, back, ok, c.text)
		}
	}
}

func TestHeaderValues(t *testing.T) {
	ev := wal.Event{ID: "id1", Payload: []byte(`{}`), Headers: []byte(`{
		"snowflake": 1234567890123456789, "big": 1e400, "price": 12.50, "z": null,
		"o": {"a": [1, null, "x", 9223372036854775808, {"b": false}], "n": null}, "s": "Zürich"}`)}
	msg, err := MessageOn(&ev, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := Headers{
		"snowflake": int64(1234567890123456789), "big": "1e400", "price": Decimal{Scale: 2, Value: 1250},
		"o": Headers{"a": []any{int64(1), nil, "x", "9223372036854775808", Headers{"b": false}}}, "s": "Zürich",
	}
	for k, w := range want {
		if !equal(msg.Headers[k], w) {
			t.Errorf("header %s = %#v, want %#v", k, msg.Headers[k], w)
		}
	}
	if _, ok := msg.Headers["z"]; ok {
		t.Error("a null member is forwarded")
	}
	if why := amqpUnsendable("x", "k", &msg, 128<<10); why != "" {
		t.Fatal(why)
	}
	for _, bad := range []string{`{"a":1} {}`, `{"a":1}]`, `[1]`, `{"a":}`} {
		if _, err := MessageOn(&wal.Event{ID: "id1", Payload: []byte(`{}`), Headers: []byte(bad)}, 0); err == nil {
			t.Errorf("headers %s accepted", bad)
		}
	}
}

// FuzzHeaderValues checks the header mapping on every JSON object: MessageOn
// never refuses one, the table the AMQP adapter puts on the wire
// (publishing) is one amqp091-go accepts and unsendableReason
// accepts unless a key is longer than AMQP allows (then it reports the key,
// so the event is poison; no mapping could send it),
// and every value is the stored one, each number's exact text recoverable
// from its AMQP value (numberText). The input is also tried as a number
// and as a member value, since random bytes are rarely an object.
func FuzzHeaderValues(f *testing.F) {
	for _, c := range headerNumberCases {
		f.Add([]byte(c.text))
	}
	f.Add([]byte(`{"a":[1,null,{"b":2.5}],"c":"d","e":true,"f":null}`))
	f.Add([]byte(`{"a":1,"a":"dup"}`))
	f.Add([]byte(`{"cdcrelay-timeline":1,"cdcrelay-commit-lsn":"0/0","cdcrelay-tx-index":{"` + strings.Repeat("k", 300) + `":1}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkHeaders(t, data)
		v := string(data)
		checkHeaders(t, []byte(`{"n":`+v+`,"l":[`+v+`,null],"o":{"m":`+v+`}}`))
	})
}

// fuzzTimeline is the session timeline the fuzzer publishes on, as the
// relay does (MessageOn): the relay's own headers are in every table.
const fuzzTimeline = 7

// checkHeaders runs MessageOn on headers and, when they are a JSON object,
// compares the table with an independent decode that keeps numbers as text.
func checkHeaders(t *testing.T, headers []byte) {
	msg, err := MessageOn(&wal.Event{ID: "id1", Payload: []byte(`{}`), Headers: headers}, fuzzTimeline)
	dec := json.NewDecoder(bytes.NewReader(headers))
	dec.UseNumber()
	var ref map[string]any
	if !json.Valid(headers) || dec.Decode(&ref) != nil {
		if err == nil && json.Valid(headers) {
			t.Fatalf("headers %q that are not an object accepted", headers)
		}
		return
	}
	if _, end := dec.Token(); end != io.EOF {
		t.Fatalf("json.Valid accepted trailing data in %q", headers)
	}
	if err != nil {
		t.Fatalf("headers %q: %v", headers, err)
	}
	wire := publishing(&msg)
	if err := wire.Headers.Validate(); err != nil {
		t.Fatalf("headers %q: amqp091-go refuses the table: %v", headers, err)
	}
	_, bad := tableSize(wire.Headers)
	switch long := longKey(ref, true); {
	case long != "" && bad == nil:
		t.Fatalf("headers %q: the %d-byte key %q encoded, above AMQP's %d", headers, len(long), clip(long), maxShortString)
	case long != "" && !strings.Contains(unsendableReason("x", "k", &wire, 0), "header key"):
		t.Fatalf("headers %q: the %d-byte key %q not reported unsendable (the event must be poison): %v", headers, len(long), clip(long), bad)
	case long == "" && bad != nil:
		t.Fatalf("headers %q: %s", headers, bad.reason("headers"))
	}
	if msg.Headers[HeaderTimeline] != int64(fuzzTimeline) || msg.Headers[HeaderTxIndex] != int64(0) {
		t.Fatalf("headers %q: the relay's ordering headers %#v, %#v; want its own", headers, msg.Headers[HeaderTimeline], msg.Headers[HeaderTxIndex])
	}
	for k, want := range ref {
		if relayHeader(k) {
			continue // the relay's own
		}
		got, present := wire.Headers[k]
		if want == nil {
			if present {
				t.Fatalf("headers %q: null member %q forwarded as %#v", headers, k, got)
			}
			continue
		}
		if !sameJSON(got, want) {
			t.Fatalf("headers %q: %q = %#v, stored %#v", headers, k, got, want)
		}
	}
}

// longKey returns a key of the decoded headers v, at any depth, longer
// than an AMQP short string allows, or "". Members the mapping leaves out
// (null ones, and at the top the relay's own headers, which it replaces)
// do not count: such an event must be poison, and only such an event.
func longKey(v any, top bool) string {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if e == nil || (top && relayHeader(k)) {
				continue
			}
			if len(k) > maxShortString {
				return k
			}
			if long := longKey(e, false); long != "" {
				return long
			}
		}
	case []any:
		for _, e := range x {
			if long := longKey(e, false); long != "" {
				return long
			}
		}
	}
	return ""
}

// relayHeader reports whether k is an ordering header the relay sets
// itself, replacing whatever the row's headers column holds under k.
func relayHeader(k string) bool {
	return k == HeaderCommitLSN || k == HeaderTxIndex || k == HeaderTimeline
}

// sameJSON reports whether the AMQP value got carries exactly the decoded
// JSON value want (numbers as json.Number text).
func sameJSON(got, want any) bool {
	switch w := want.(type) {
	case json.Number:
		text, ok := numberText(got)
		return ok && text == string(w)
	case map[string]any:
		g, ok := got.(amqp.Table)
		if !ok {
			return false
		}
		n := 0
		for k, e := range w {
			if e == nil {
				if _, present := g[k]; present {
					return false
				}
				continue
			}
			n++
			if !sameJSON(g[k], e) {
				return false
			}
		}
		return len(g) == n
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !sameJSON(g[i], w[i]) {
				return false
			}
		}
		return true
	default: // string, bool, nil (an array element)
		return got == want
	}
}
