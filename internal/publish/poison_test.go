package publish

import (
	"strings"
	"testing"

	"github.com/cdcrelay/cdcrelay/internal/wal"
)

func TestPoisonReason(t *testing.T) {
	long := strings.Repeat("k", 256)
	tests := []struct {
		name string
		ev   wal.Event
		want string // substring of the reason; "" = publishable
	}{
		{"good", wal.Event{RoutingKey: "a.b", Payload: []byte(`{"x":1}`)}, ""},
		{"routing key at the limit", wal.Event{RoutingKey: long[:255], Payload: []byte(`{}`)}, ""},
		{"decoder problem", wal.Event{Problem: `column "routing_key" is NULL`, Payload: []byte(`{}`)}, "is NULL"},
		{"routing key too long", wal.Event{RoutingKey: long, Payload: []byte(`{}`)}, "routing key is 256 bytes"},
		{"exchange too long", wal.Event{Exchange: long, Payload: []byte(`{}`)}, "exchange name is 256 bytes"},
		{"not JSON", wal.Event{Payload: []byte(`hello`)}, "not valid JSON"},
		{"empty payload", wal.Event{Payload: nil}, "not valid JSON"},
		{"jsonb payload is not validated again", wal.Event{Payload: []byte(`{"x":1}`), PayloadIsJSON: true}, ""},
		{"too large", wal.Event{Payload: []byte(`"` + strings.Repeat("x", 2000) + `"`)}, "above CDCRELAY_MAX_MESSAGE_BYTES"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := poisonReason(&tt.ev, 1024)
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Fatalf("poisonReason = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDeadLetter(t *testing.T) {
	ev := wal.Event{ID: "id1", RoutingKey: strings.Repeat("k", 300), Payload: []byte("0123456789"), CommitLSN: 0x10, Index: 2}
	msg := deadLetter(&ev, "why", 4)
	if string(msg.Body) != "0123" || msg.ID != "id1" || msg.Headers[HeaderError] != "why" ||
		msg.Headers[HeaderCommitLSN] != "0/10" || msg.Headers[HeaderTxIndex] != int64(2) {
		t.Fatalf("dead letter %+v", msg)
	}
	if _, ok := msg.Headers["cdcrelay-routing-key"]; ok {
		t.Fatal("an over-long routing key was copied into a header")
	}
	if err := publishing(&msg).Headers.Validate(); err != nil {
		t.Fatal(err)
	}
}
