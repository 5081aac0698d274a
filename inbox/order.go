package inbox

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The relay's ordering headers (docs/messages.md, "Message format").
const (
	HeaderCommitLSN = "cdcrelay-commit-lsn"
	HeaderTxIndex   = "cdcrelay-tx-index"
	// HeaderTimeline is absent on messages of relays older than the
	// header, and when the relay did not know its server's timeline.
	HeaderTimeline = "cdcrelay-timeline"
)

// Position is an event's place in the relay's total order: the server's
// timeline when the relay published it, its transaction's commit LSN, then
// its index among that transaction's outbox rows. Timeline is 0 when the
// message carries none. Valid is false for a message without the relay's
// commit LSN and index.
type Position struct {
	Timeline  uint32
	CommitLSN uint64
	TxIndex   int64
	Valid     bool
}

// Less orders positions by timeline, then commit LSN, then index. A
// promoted standby starts a greater timeline and reuses LSNs the old
// primary used for transactions it never received, so without the
// timeline a new event would sort below events delivered before the
// promotion. When either position has no timeline (a relay older than the
// header) it compares commit LSN and index alone, as before the header
// existed: an upgrade or a rollback of the relay on one timeline then
// keeps the order, and only a promotion at the same time goes unseen.
func (p Position) Less(q Position) bool {
	if p.Timeline != 0 && q.Timeline != 0 && p.Timeline != q.Timeline {
		return p.Timeline < q.Timeline
	}
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
	// 1, a retried event that later events overtook. An event of a later
	// timeline (a promoted standby's) is never late against one of an
	// earlier timeline, whatever their commit LSNs.
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

// PositionOf reads the relay's headers of a delivery (its Headers), as
// Handle and HandleEffect do for Event.Position; a missing or malformed commit LSN
// or index gives an invalid position, never an error: ordering is help,
// not a requirement. A missing or malformed timeline (not a positive
// 32-bit integer) leaves the timeline unknown, which compares as a message
// from a relay older than the header does.
func PositionOf(h amqp.Table) Position {
	lsnText, ok := h[HeaderCommitLSN].(string)
	if !ok {
		return Position{}
	}
	lsn, err := parseLSN(lsnText)
	if err != nil {
		return Position{}
	}
	index, ok := intHeader(h[HeaderTxIndex])
	if !ok || index < 0 {
		return Position{}
	}
	return Position{Timeline: timelineOf(intHeader(h[HeaderTimeline])), CommitLSN: lsn, TxIndex: index, Valid: true}
}

// timelineOf is a timeline read from a header or the ledger: unknown (0)
// unless it is a positive 32-bit integer, as PostgreSQL's timelines are.
func timelineOf(n int64, ok bool) uint32 {
	if !ok || n <= 0 || n > math.MaxUint32 {
		return 0
	}
	return uint32(n)
}

// intHeader reads an integer header in any AMQP integer type a client
// library may decode it to (the relay sends long-longs).
func intHeader(v any) (int64, bool) {
	switch v := v.(type) {
	case int64:
		return v, true
	case int32:
		return int64(v), true
	case int16:
		return int64(v), true
	case int8:
		return int64(v), true
	case int:
		return int64(v), true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	default:
		return 0, false
	}
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
