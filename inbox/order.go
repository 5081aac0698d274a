package inbox

import (
	"fmt"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The relay's ordering headers (docs/messages.md, "Message format").
const (
	HeaderCommitLSN = "cdcrelay-commit-lsn"
	HeaderTxIndex   = "cdcrelay-tx-index"
)

// Position is an event's place in the relay's total order: its
// transaction's commit LSN, then its index among that transaction's outbox
// rows. Valid is false for a message without the relay's headers.
type Position struct {
	CommitLSN uint64
	TxIndex   int64
	Valid     bool
}

// Less orders positions by commit LSN, then index.
func (p Position) Less(q Position) bool {
	if p.CommitLSN != q.CommitLSN {
		return p.CommitLSN < q.CommitLSN
	}
	return p.TxIndex < q.TxIndex
}

// LSNText is the commit LSN as PostgreSQL writes it (0/1A2B3C).
func (p Position) LSNText() string {
	return fmt.Sprintf("%X/%X", p.CommitLSN>>32, uint32(p.CommitLSN))
}

// Order says where an event stands among the events of its routing key that
// this handler has claimed.
type Order int

const (
	// OrderUnknown: the message carries no valid relay headers.
	OrderUnknown Order = iota
	// OrderFirst: the first event of its routing key this handler sees
	// (or the first since retention removed the key's record).
	OrderFirst
	// OrderNext: its position is above every position seen for the key:
	// it arrived in commit order.
	OrderNext
	// OrderLate: an event with a greater position was claimed before it.
	// Its message_id was not seen, so by the rule of docs/messages.md it
	// is not a redelivery but a new event whose first delivery came after
	// later ones (after the broker refused it), or, for an Attempt above
	// 1, a retried event that later events overtook.
	OrderLate
)

func (o Order) String() string {
	return [...]string{"unknown", "first", "next", "late"}[o]
}

// classify compares an event's position with the greatest one seen for its
// key (seen.Valid false: none).
func classify(pos, seen Position) Order {
	switch {
	case !pos.Valid:
		return OrderUnknown
	case !seen.Valid:
		return OrderFirst
	case pos.Less(seen):
		return OrderLate
	default:
		return OrderNext
	}
}

// positionOf reads the relay's headers; a missing or malformed one gives an
// invalid position, never an error: ordering is help, not a requirement.
func positionOf(h amqp.Table) Position {
	lsnText, ok := h[HeaderCommitLSN].(string)
	if !ok {
		return Position{}
	}
	lsn, err := parseLSN(lsnText)
	if err != nil {
		return Position{}
	}
	var index int64
	switch v := h[HeaderTxIndex].(type) {
	case int64:
		index = v
	case int32:
		index = int64(v)
	case int16:
		index = int64(v)
	case int8:
		index = int64(v)
	case int:
		index = int64(v)
	case uint8:
		index = int64(v)
	case uint16:
		index = int64(v)
	case uint32:
		index = int64(v)
	default:
		return Position{}
	}
	if index < 0 {
		return Position{}
	}
	return Position{CommitLSN: lsn, TxIndex: index, Valid: true}
}

// parseLSN reads PostgreSQL's text form of an LSN: two hexadecimal 32-bit
// halves separated by a slash.
func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok || hi == "" || lo == "" {
		return 0, fmt.Errorf("LSN %q: want two hexadecimal halves separated by /", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("LSN %q: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("LSN %q: %w", s, err)
	}
	return h<<32 | l, nil
}
