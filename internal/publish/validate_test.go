package publish

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/testenv"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

func TestUnsendable(t *testing.T) {
	long := strings.Repeat("v", 300)
	ok255 := strings.Repeat("v", 255)
	base := func() amqp.Publishing {
		return amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: "id",
			Timestamp: time.Unix(1, 0), Headers: amqp.Table{"a": "b"}, Body: []byte(`{}`)}
	}
	with := func(f func(*amqp.Publishing)) amqp.Publishing {
		m := base()
		f(&m)
		return m
	}
	tests := []struct {
		name     string
		exchange string
		key      string
		msg      amqp.Publishing
		frameMax int
		want     string // substring of the reason; "" = sendable
	}{
		{"good", "ex", "k", base(), 131072, ""},
		{"short strings at the limit", ok255, ok255, with(func(m *amqp.Publishing) {
			m.MessageId, m.Type, m.AppId, m.Headers = ok255, ok255, ok255, amqp.Table{ok255: ok255}
		}), 131072, ""},
		{"exchange", long, "k", base(), 0, "exchange name is 300 bytes"},
		{"routing key", "", long, base(), 0, "routing key is 300 bytes"},
		{"message_id", "", "k", with(func(m *amqp.Publishing) { m.MessageId = long }), 0, "message_id is 300 bytes"},
		{"type", "", "k", with(func(m *amqp.Publishing) { m.Type = long }), 0, "type is 300 bytes"},
		{"content_type", "", "k", with(func(m *amqp.Publishing) { m.ContentType = long }), 0, "content_type is 300 bytes"},
		{"correlation_id", "", "k", with(func(m *amqp.Publishing) { m.CorrelationId = long }), 0, "correlation_id is 300"},
		{"reply_to", "", "k", with(func(m *amqp.Publishing) { m.ReplyTo = long }), 0, "reply_to is 300"},
		{"expiration", "", "k", with(func(m *amqp.Publishing) { m.Expiration = long }), 0, "expiration is 300"},
		{"user_id", "", "k", with(func(m *amqp.Publishing) { m.UserId = long }), 0, "user_id is 300"},
		{"app_id", "", "k", with(func(m *amqp.Publishing) { m.AppId = long }), 0, "app_id is 300"},
		{"content_encoding", "", "k", with(func(m *amqp.Publishing) { m.ContentEncoding = long }), 0, "content_encoding is 300"},
		{"header key", "", "k", with(func(m *amqp.Publishing) { m.Headers[long] = "x" }), 0, "header key headers[\"vvvv"},
		{"nested header key", "", "k", with(func(m *amqp.Publishing) {
			m.Headers["outer"] = amqp.Table{"inner": amqp.Table{long: int64(1)}}
		}), 0, `header key headers["outer"]["inner"]["vvv`},
		{"header key in a table in an array", "", "k", with(func(m *amqp.Publishing) {
			m.Headers["list"] = []any{"a", amqp.Table{long: true}}
		}), 0, `headers["list"][1]["vvv`},
		{"a Go map is not a table", "", "k", with(func(m *amqp.Publishing) { m.Headers["m"] = map[string]any{"a": 1} }), 0, "type map[string]interface {}"},
		{"uint64", "", "k", with(func(m *amqp.Publishing) { m.Headers["n"] = uint64(1) }), 0, "type uint64"},
		{"every supported type", "", "k", with(func(m *amqp.Publishing) {
			m.Headers = amqp.Table{"b": true, "u8": byte(1), "i8": int8(1), "i16": int16(1), "u16": uint16(1), "i": 1,
				"i32": int32(1), "u32": uint32(1), "f32": float32(1), "i64": int64(1), "f64": 1.5, "t": time.Unix(1, 0),
				"d": amqp.Decimal{Scale: 1, Value: 1}, "s": "s", "x": []byte("x"), "nil": nil, "a": []any{1, "a"}, "tb": amqp.Table{"k": "v"}}
		}), 131072, ""},
		{"headers above the frame size", "", "k", with(func(m *amqp.Publishing) { m.Headers["big"] = strings.Repeat("h", 200000) }), 131072, "above the broker's frame size of 131072"},
		{"no frame size negotiated", "", "k", with(func(m *amqp.Publishing) { m.Headers["big"] = strings.Repeat("h", 200000) }), 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := unsendableReason(tt.exchange, tt.key, &tt.msg, tt.frameMax)
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Fatalf("unsendableReason = %q, want %q", got, tt.want)
			}
			if strings.Contains(got, long) {
				t.Fatalf("reason quotes the whole 300-byte value: %q", got)
			}
			// Whatever we accept, amqp091-go's own validation accepts.
			if err := tt.msg.Headers.Validate(); got == "" && err != nil {
				t.Fatalf("accepted headers that Table.Validate refuses: %v", err)
			}
		})
	}
}

// TestUnsendableFrameSizeExact pins the size computation to the encoder's
// layout at the boundary: a content header frame of exactly frame_max-8
// bytes of payload passes, one byte more does not.
func TestUnsendableFrameSizeExact(t *testing.T) {
	// fixed 14 + message_id (1+2) + headers (4 + key 1+1 + string 1+4+len).
	msg := amqp.Publishing{MessageId: "id", Headers: amqp.Table{"k": ""}}
	size := 14 + 3 + 4 + 2 + 5
	if got := unsendableReason("", "k", &msg, size+frameOverhead); got != "" {
		t.Fatalf("a header frame of exactly the limit refused: %s", got)
	}
	if got := unsendableReason("", "k", &msg, size+frameOverhead-1); !strings.Contains(got, fmt.Sprintf("encode to %d bytes", size)) {
		t.Fatalf("one byte over the limit: %q", got)
	}
}

// TestUnsendableMessages: what Message builds from rows a service may
// write is judged on the built message: the envelope's event_type, the
// type column, a text id and header keys at any depth.
func TestUnsendableMessages(t *testing.T) {
	long := strings.Repeat("e", 300)
	tests := []struct {
		name string
		ev   wal.Event
		want string
	}{
		{"envelope event_type", wal.Event{ID: "1", Payload: []byte(`{"event_type":"` + long + `"}`)}, "type is 300 bytes"},
		{"type column", wal.Event{ID: "1", Type: long, Payload: []byte(`{}`)}, "type is 300 bytes"},
		{"text id", wal.Event{ID: long, Payload: []byte(`{}`)}, "message_id is 300 bytes"},
		{"header key", wal.Event{ID: "1", Payload: []byte(`{}`), Headers: []byte(`{"` + long + `":1}`)}, "header key"},
		{"nested header key", wal.Event{ID: "1", Payload: []byte(`{}`), Headers: []byte(`{"a":{"b":[{"` + long + `":1}]}}`)}, `headers["a"]["b"][0]`},
		{"good", wal.Event{ID: "1", Payload: []byte(`{"event_type":"T"}`), Headers: []byte(`{"a":{"b":[1,null,"x",1.5,true]}}`)}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := MessageOn(&tt.ev, 0)
			if err != nil {
				t.Fatal(err)
			}
			got := amqpUnsendable("ex", "k", &msg, 131072)
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Fatalf("amqpUnsendable = %q, want %q", got, tt.want)
			}
			if strings.Contains(got, long) {
				t.Fatalf("reason quotes the whole value: %q", got)
			}
		})
	}
}

func TestClip(t *testing.T) {
	if got := clip("short"); got != "short" {
		t.Fatalf("clip(short) = %q", got)
	}
	got := clip(strings.Repeat("a", 300))
	if got != strings.Repeat("a", 64)+"…(300 bytes)" {
		t.Fatalf("clip = %q", got)
	}
	// A cut never splits a character.
	got = clip(strings.Repeat("a", 63) + strings.Repeat("é", 100))
	if !strings.HasPrefix(got, strings.Repeat("a", 63)+"…") {
		t.Fatalf("Clip split a character: %q", got)
	}
}

func TestTransportErrors(t *testing.T) {
	shortstr := fmt.Errorf("amqp: shortstr %q exceeds 255 bytes", strings.Repeat("x", 300))
	tests := []struct {
		err       error
		transport bool
	}{
		{amqp.ErrClosed, true},
		{fmt.Errorf("wrapped: %w", amqp.ErrClosed), true},
		{&amqp.Error{Code: amqp.ChannelError, Reason: "channel closed"}, true},
		{&net.OpError{Op: "write", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{syscall.EPIPE, true},
		{net.ErrClosed, true},
		{io.ErrShortWrite, true},
		{context.Canceled, true},
		{context.DeadlineExceeded, true},
		{errors.New("write tcp 127.0.0.1:1->127.0.0.1:2: write: broken pipe"), true},
		{shortstr, false},
		{fmt.Errorf("writing key %q: %w", "k", shortstr), false},
		{errors.New(`table field "h" value uint64 not supported`), false},
		{amqp.ErrFieldType, false},
		{amqp.ErrSyntax, false},
	}
	for _, tt := range tests {
		if got := transport(tt.err); got != tt.transport {
			t.Errorf("transport(%v) = %v, want %v", tt.err, got, tt.transport)
		}
	}
}

// TestEncodeErrorRemembered: an encoding error the checks did not foresee
// ends the session once, with a clipped reason, and the next session's
// publisher parks the same event instead of publishing it; a transport
// error is never remembered.
func TestEncodeErrorRemembered(t *testing.T) {
	refused := &Refusals{}
	p := NewPublisher(nil, nil, nil, nil, PublisherConfig{Refused: refused, MaxMessageBytes: 1 << 20, Log: slog.New(slog.DiscardHandler)})
	ev := wal.Event{ID: "id-1", RoutingKey: "k", Payload: []byte(`{}`), CommitLSN: pglogrepl.LSN(0x100), Index: 3}
	long := strings.Repeat("x", 300)

	if err := p.publishError(&ev, fmt.Errorf("send: %w", amqp.ErrClosed)); !errors.Is(err, amqp.ErrClosed) || refused.Len() != 0 {
		t.Fatalf("transport error: %v, %d remembered", err, refused.Len())
	}
	if _, reason := p.build(&ev, "ex"); reason != "" {
		t.Fatalf("event refused after a transport error: %s", reason)
	}

	err := p.publishError(&ev, &unencodable{err: fmt.Errorf("amqp: shortstr %q exceeds 255 bytes", long)})
	var encErr *EncodeError
	if !errors.As(err, &encErr) || strings.Contains(err.Error(), long) {
		t.Fatalf("encoding error: %v", err)
	}
	_, reason := p.build(&ev, "ex")
	if !strings.Contains(reason, "could not encode") || strings.Contains(reason, long) {
		t.Fatalf("next session's reason %q", reason)
	}
	// The same id at another position is another event.
	other := ev
	other.Index = 4
	if _, reason := p.build(&other, "ex"); reason != "" {
		t.Fatalf("another event refused: %s", reason)
	}
}

// TestIntegrationLibraryEncodingErrors pins what amqp091-go does with each value it
// cannot encode, on a real broker: the error it returns is classified as
// an encoding error, never as transport, and after a frame error the
// connection is shut down (so the session must end: the reason for
// Refusals). Every such message is caught by Unsendable first.
func TestIntegrationLibraryEncodingErrors(t *testing.T) {
	url := testenv.RequireAMQP(t)
	long := strings.Repeat("z", 300)
	tests := []struct {
		name      string
		msg       amqp.Publishing
		key       string
		connDies  bool
		errSubstr string
	}{
		{"type", amqp.Publishing{Type: long}, "k", true, "shortstr"},
		{"message_id", amqp.Publishing{MessageId: long}, "k", true, "shortstr"},
		{"header key", amqp.Publishing{Headers: amqp.Table{long: 1}}, "k", true, "shortstr"},
		{"nested header key", amqp.Publishing{Headers: amqp.Table{"a": amqp.Table{long: 1}}}, "k", true, "shortstr"},
		{"routing key", amqp.Publishing{}, long, true, "shortstr"},
		{"header type", amqp.Publishing{Headers: amqp.Table{"a": uint64(1)}}, "k", false, "not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if reason := unsendableReason("", tt.key, &tt.msg, 131072); reason == "" {
				t.Fatal("Unsendable accepts it")
			}
			conn, ch := testenv.MustChannel(t, url)
			if err := ch.Confirm(false); err != nil {
				t.Fatal(err)
			}
			closed := conn.NotifyClose(make(chan *amqp.Error, 1))
			_, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", tt.key, false, false, tt.msg)
			if err == nil || !strings.Contains(err.Error(), tt.errSubstr) {
				t.Fatalf("publish error %v, want %q", err, tt.errSubstr)
			}
			if transport(err) {
				t.Fatalf("encoding error %v classified as transport", err)
			}
			select {
			case e := <-closed:
				if !tt.connDies {
					t.Fatalf("connection closed after a validation error: %v", e)
				}
				t.Logf("connection shut down after the encoding error: %v", e.Code)
			case <-time.After(2 * time.Second):
				if tt.connDies {
					t.Fatal("connection still open after a frame encoding error")
				}
			}
		})
	}
}

func TestDeadLetterLongID(t *testing.T) {
	long := strings.Repeat("i", 300)
	ev := wal.Event{ID: long, RoutingKey: "k", Payload: []byte(`{}`)}
	msg := deadLetter(&ev, "why", 1024)
	if msg.ID != "" || msg.Headers[HeaderID] != long {
		t.Fatalf("dead letter id %q, header %v", msg.ID, msg.Headers[HeaderID])
	}
	if reason := amqpUnsendable("dlx", "k", &msg, 131072); reason != "" {
		t.Fatalf("dead letter unsendable: %s", reason)
	}
}

func TestLogID(t *testing.T) {
	id := strings.Repeat("i", 255)
	if logID(id) != id {
		t.Fatal("an id that fits message_id was clipped")
	}
	if got := logID(id + "i"); got != strings.Repeat("i", 64)+"…(256 bytes)" {
		t.Fatalf("LogID = %q", got)
	}
}

// TestClosedErrorSaysWhy: a channel the broker closed carries its reason,
// and a 404 the remedy; both stay ErrClosed and the *amqp.Error.
func TestClosedErrorSaysWhy(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    *amqp.Error
		ok   bool
		want []string
		not  []string
	}{
		{"no reason", nil, false, []string{"broker connection closed: channel closed"}, []string{"by the broker"}},
		{"deleted exchange", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange 'orders' in vhost '/'"}, true,
			[]string{"closed by the broker: 404 NOT_FOUND - no exchange 'orders' in vhost '/'", "declare it", "CDCRELAY_EXCHANGE"}, nil},
		{"other reason", &amqp.Error{Code: amqp.FrameError, Reason: "FRAME_ERROR"}, true,
			[]string{"closed by the broker: 501 FRAME_ERROR"}, []string{"declare it"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := closedError("channel", classifyClose(tc.e), tc.ok)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(err.Error(), n) {
					t.Errorf("%q has %q", err, n)
				}
			}
			var aerr *amqp.Error
			if !errors.Is(err, ErrClosed) || (tc.e != nil) != errors.As(err, &aerr) {
				t.Errorf("%v: ErrClosed %v, *amqp.Error %v", err, errors.Is(err, ErrClosed), errors.As(err, &aerr))
			}
		})
	}
}

// TestLaneCloseReason: the reason is read without waiting, kept once
// read, and absent (nil) for a lane the broker did not close.
func TestLaneCloseReason(t *testing.T) {
	l := &lane{reason: make(chan *amqp.Error, 1)}
	if e := l.closeReason(); e != nil {
		t.Fatalf("open lane: %v", e)
	}
	want := &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND"}
	l.reason <- want
	close(l.reason)
	if e := l.closeReason(); e == nil || !errors.Is(e.err, want) || e.kind != closeNoExchange {
		t.Fatalf("closed lane: %+v", e)
	}
	if e := l.closeReason(); e == nil || !errors.Is(e.err, want) {
		t.Fatalf("asked again: %+v", e)
	}
	if err := laneClosed(l); !strings.Contains(err.Error(), "404") {
		t.Fatalf("laneClosed = %v", err)
	}
	if e := (&lane{}).closeReason(); e != nil {
		t.Fatalf("lane without a reason channel: %v", e)
	}
}

// TestBrokerHeaderRules: CC and BCC must be arrays of strings, as RabbitMQ
// requires (it closes the channel otherwise); every other header is free.
func TestBrokerHeaderRules(t *testing.T) {
	for _, c := range []struct {
		name    string
		headers amqp.Table
		want    string // a fragment of the reason; "" for none
	}{
		{"no routing headers", amqp.Table{"x": "y", "cc": "lower case is not CC"}, ""},
		{"CC array of strings", amqp.Table{"CC": []any{"a.b", "c"}}, ""},
		{"BCC empty array", amqp.Table{"BCC": []any{}}, ""},
		{"CC string", amqp.Table{"CC": "x"}, "header CC is a string"},
		{"BCC number", amqp.Table{"BCC": int64(7)}, "header BCC is a number"},
		{"CC object", amqp.Table{"CC": amqp.Table{"a": "b"}}, "header CC is an object"},
		{"CC null", amqp.Table{"CC": nil}, "header CC is null"},
		{"CC array with a number", amqp.Table{"CC": []any{"a", 1.5}}, "header CC[1] is a number"},
		{"BCC array with an array", amqp.Table{"BCC": []any{[]any{"a"}}}, "header BCC[0] is an array"},
	} {
		t.Run(c.name, func(t *testing.T) {
			msg := amqp.Publishing{Headers: c.headers, Body: []byte(`{}`)}
			got := unsendableReason("events", "k", &msg, 131072)
			if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
				t.Fatalf("unsendableReason = %q, want %q", got, c.want)
			}
		})
	}
}
