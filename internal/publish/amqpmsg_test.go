package publish

import (
	"reflect"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// TestAMQPHeadersConvertedOnce: headers of strings and integers go to
// amqp091-go as the message's own map; headers that need converting (a
// decimal, a nested object) are copied once per message, and judging the
// message (Link.unsendable) and publishing it use that one copy, with the
// values amqp091-go encodes.
func TestAMQPHeadersConvertedOnce(t *testing.T) {
	mapOf := func(m any) uintptr { return reflect.ValueOf(m).Pointer() }

	plain, err := MessageOn(&wal.Event{ID: "1", Payload: []byte(`{}`), Headers: []byte(`{"tenant": "acme", "n": 3}`)}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := publishing(&plain).Headers; mapOf(got) != mapOf(plain.Headers) {
		t.Fatal("headers of strings and integers were copied")
	}

	nested, err := MessageOn(&wal.Event{ID: "2", Payload: []byte(`{}`), Headers: []byte(`{"price": 12.50, "o": {"a": [1.5, "x"]}}`)}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if why := amqpUnsendable("outbox", "k", &nested, 131072); why != "" {
		t.Fatal(why)
	}
	judged := nested.sinkHeaders
	sent := publishing(&nested).Headers
	if judged == nil || mapOf(judged) != mapOf(sent) {
		t.Fatal("the table judged and the table published are not one conversion")
	}
	if mapOf(sent) == mapOf(nested.Headers) {
		t.Fatal("headers holding a decimal were sent without conversion")
	}
	want := amqp.Decimal{Scale: 2, Value: 1250}
	if sent["price"] != want {
		t.Fatalf("price %#v, want %#v", sent["price"], want)
	}
	o, ok := sent["o"].(amqp.Table)
	if !ok {
		t.Fatalf("nested object %#v is not an amqp.Table", sent["o"])
	}
	if l, ok := o["a"].([]any); !ok || len(l) != 2 || l[0] != (amqp.Decimal{Scale: 1, Value: 15}) || l[1] != "x" {
		t.Fatalf("nested list %#v", o["a"])
	}
	if err := sent.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, ok := nested.Headers["price"].(Decimal); !ok {
		t.Fatal("converting changed the core's own headers")
	}
}
