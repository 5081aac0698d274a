package wal

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// ErrSchema marks an outbox row the relay cannot map to a message: an
// unknown relation or a required column missing or NULL. Nothing past it may
// be confirmed.
var ErrSchema = errors.New("outbox schema mismatch")

// ErrProtocol marks messages in an order pgoutput never sends them.
var ErrProtocol = errors.New("pgoutput protocol violation")

// ErrNotOutbox marks an insert that may be an outbox row under another
// identity: a relation with the outbox's configured schema and name but
// another OID (the outbox dropped and created again). The relay stops
// rather than confirm past a row it cannot classify (invariant 9, docs/architecture.md).
var ErrNotOutbox = fmt.Errorf("%w: insert into a relation that is not the outbox table", ErrSchema)

// ErrRelationUnknown marks an insert from a relation the session start
// did not classify (a table added to the publication since). It ends the
// session before anything past it is confirmed, but is not fatal: the
// next session start reads the publication again and classifies it.
var ErrRelationUnknown = errors.New("insert into a relation the session did not classify")

// RelationUnknownError is ErrRelationUnknown with the relation it names,
// which the relay remembers so that the next session start classifies it
// even when the publication no longer lists it.
type RelationUnknownError struct {
	OID  uint32
	Name string // schema.table as pgoutput sent it
}

func (e *RelationUnknownError) Error() string {
	return fmt.Sprintf("%s: %s (relation %d), added to the publication since the session started; the next session classifies it", ErrRelationUnknown, e.Name, e.OID)
}

// Unwrap makes errors.Is(err, ErrRelationUnknown) hold.
func (e *RelationUnknownError) Unwrap() error { return ErrRelationUnknown }

// Mapping is the outbox description (its table and the columns the relay
// reads) with what a session learns about it. Optional columns (headers,
// exchange, type) are used when the table has them.
type Mapping struct {
	config.Outbox
	// OID identifies the outbox table (resolved at session start): a
	// Relation with this OID is the outbox whatever name it carries, so a
	// rename or move mid-stream is followed, never skipped. Zero maps by
	// Schema and Table (tests only).
	OID uint32
	// Foreign holds the relations known at session start to be provably
	// not the outbox (OID to qualified name): their inserts are skipped.
	Foreign map[uint32]string
	// MaxMessageBytes, if positive, is CDCRELAY_MAX_MESSAGE_BYTES: a row
	// larger than this is poison, judged before its values are copied.
	MaxMessageBytes int64
}

// Event is one outbox row, ready to publish. Its byte slices are owned by
// the event (copied out of the replication buffer).
type Event struct {
	ID         string
	RoutingKey string
	Payload    []byte
	Headers    []byte // JSON object, nil when the column is absent or NULL
	Exchange   string // empty: the configured default
	Type       string
	CommitLSN  pglogrepl.LSN
	CommitTime time.Time
	Index      int // position of the event among the outbox rows of its transaction
	// Xid is the event's transaction id (pgoutput's Begin), 0 for a row
	// read from a snapshot: the janitor asks whether that transaction is
	// visible yet before it counts an unseen row as gone.
	Xid uint32
	Seq uint64 // position in the session's stream, assigned by the watermark tracker
	// PayloadIsJSON is set when the payload column is json or jsonb, whose
	// values PostgreSQL has already validated.
	PayloadIsJSON bool
	// Problem, when set, says why the row cannot become a message (a NULL
	// routing key or payload). Such a row is poison: it is handled by the
	// poison policy, never published as is.
	Problem string
	// Backfill marks an event read from a new slot's snapshot rather than
	// the stream: its CommitTime is the row's enqueued_at, which can be
	// hours old, so it stays out of the commit-to-ack latency.
	Backfill bool
}

// Place is where an event sits in the stream: its transaction's commit LSN
// and its index among that transaction's outbox rows. A slot replays the
// same rows at the same places in every session, so a place names one
// event across sessions (publish.Carryover relies on it).
type Place struct {
	CommitLSN pglogrepl.LSN
	Index     int
}

// Place is the event's place in the stream.
func (e *Event) Place() Place { return Place{CommitLSN: e.CommitLSN, Index: e.Index} }

// Before reports whether p comes before q in the stream: transactions in
// commit order, rows in their order within a transaction.
func (p Place) Before(q Place) bool {
	return p.CommitLSN < q.CommitLSN || (p.CommitLSN == q.CommitLSN && p.Index < q.Index)
}

// String is "LSN#index", as logs show a place.
func (p Place) String() string { return fmt.Sprintf("%s#%d", p.CommitLSN, p.Index) }

// Size is the event's weight against the in-flight byte budget.
func (e *Event) Size() int {
	return len(e.ID) + len(e.RoutingKey) + len(e.Payload) + len(e.Headers) + len(e.Exchange) + len(e.Type)
}

// Weight is what the event takes from a byte budget of limit bytes: its
// size, or the whole budget when it is larger, so it goes alone.
func (e *Event) Weight(limit int64) int64 {
	return min(int64(e.Size()), limit)
}

// stepKind says what a decoded message means to the relay.
type stepKind int

// The kinds of step.
const (
	stepNone   stepKind = iota // nothing to do (ignored message, other table, relation)
	stepBegin                  // a transaction opened
	stepEvent                  // an outbox row
	stepCommit                 // a transaction closed; Commit.TransactionEndLSN may be confirmed once acked
)

// step is the result of decoding one message.
type step struct {
	Kind   stepKind
	Event  Event
	Commit commitMsg
	// Notice, when set, is something the operator must hear about once per
	// session (the outbox table was renamed or moved, a foreign insert was
	// skipped): log it as a warning.
	Notice string
	// Skipped is set for an insert from a foreign relation, skipped.
	Skipped bool
}

// Decoder turns pgoutput messages into outbox events. It holds the relation
// cache and the open transaction, so one Decoder serves one replication
// session and is not safe for concurrent use.
type Decoder struct {
	mapping   Mapping
	relations map[uint32]*relation
	open      bool
	begin     beginMsg
	index     int
	renamed   bool // the rename notice was given this session
	// skipped holds the foreign relations whose skip notice was given this
	// session (a Relation message may come again for the same OID).
	skipped map[uint32]bool
}

// relation is a cached Relation with the mapping resolved to tuple indexes
// (-1 when absent). problem is set when a required column is missing; it is
// reported only when a row of the relation must be published, so schema
// changes that come with deletes or updates only do not stop the relay.
type relation struct {
	outbox                                       bool
	foreign                                      bool   // provably not the outbox: inserts skipped
	recreated                                    bool   // the outbox's name under another OID
	name                                         string // schema.table as pgoutput sent it
	id, key, payload, headers, exchange, msgType int
	columns                                      int
	payloadIsJSON                                bool
	problem                                      error
}

// NewDecoder returns a Decoder for the given mapping.
func NewDecoder(m Mapping) *Decoder {
	return &Decoder{mapping: m, relations: make(map[uint32]*relation), skipped: make(map[uint32]bool)}
}

// Decode consumes one pgoutput message.
func (d *Decoder) Decode(data []byte) (step, error) {
	msg, err := parseMessage(data)
	if err != nil {
		return step{}, err
	}
	switch m := msg.(type) {
	case *beginMsg:
		if d.open {
			return step{}, fmt.Errorf("%w: begin of xid %d inside xid %d", ErrProtocol, m.Xid, d.begin.Xid)
		}
		d.open, d.begin, d.index = true, *m, 0
		return step{Kind: stepBegin}, nil
	case *commitMsg:
		if !d.open {
			return step{}, fmt.Errorf("%w: commit %s without begin", ErrProtocol, m.CommitLSN)
		}
		d.open = false
		return step{Kind: stepCommit, Commit: *m}, nil
	case *relationMsg:
		rel := d.resolve(m)
		d.relations[m.ID] = rel
		return step{Notice: d.renameNotice(m, rel)}, nil
	case *insertMsg:
		return d.insert(m)
	default:
		return step{}, nil
	}
}

func (d *Decoder) resolve(m *relationMsg) *relation {
	rel := &relation{columns: len(m.Columns), name: m.Namespace + "." + m.Name}
	if !d.isOutbox(m) {
		// The outbox's name under another OID may be the outbox created
		// again, even on an OID known foreign (renamed into its place).
		rel.recreated = m.Namespace == d.mapping.Schema && m.Name == d.mapping.Table
		_, known := d.mapping.Foreign[m.ID]
		rel.foreign = known && !rel.recreated
		return rel
	}
	rel.outbox = true
	index := func(name string) int {
		for i, c := range m.Columns {
			if name != "" && c.Name == name {
				return i
			}
		}
		return -1
	}
	rel.id, rel.key, rel.payload = index(d.mapping.IDColumn), index(d.mapping.RoutingKeyColumn), index(d.mapping.PayloadColumn)
	rel.headers, rel.exchange, rel.msgType = index(d.mapping.HeadersColumn), index(d.mapping.ExchangeColumn), index(d.mapping.TypeColumn)
	// PostgreSQL type OIDs of json and jsonb.
	if rel.payload >= 0 {
		oid := m.Columns[rel.payload].TypeOID
		rel.payloadIsJSON = oid == 114 || oid == 3802
	}
	for _, req := range []struct {
		name string
		at   int
	}{{d.mapping.IDColumn, rel.id}, {d.mapping.RoutingKeyColumn, rel.key}, {d.mapping.PayloadColumn, rel.payload}} {
		if req.at < 0 {
			rel.problem = fmt.Errorf("%w: table %s.%s has no column %q", ErrSchema, m.Namespace, m.Name, req.name)
			break
		}
	}
	return rel
}

// isOutbox maps a Relation to the outbox by OID, by name only when no OID
// was resolved.
func (d *Decoder) isOutbox(m *relationMsg) bool {
	if d.mapping.OID != 0 {
		return m.ID == d.mapping.OID
	}
	return m.Namespace == d.mapping.Schema && m.Name == d.mapping.Table
}

// renameNotice reports, once per session, an outbox Relation whose name is
// no longer the configured one: its rows are still published, but the
// janitor, the monitor and the next session start look the table up by
// its configured name.
func (d *Decoder) renameNotice(m *relationMsg, rel *relation) string {
	if !rel.outbox || d.renamed || (m.Namespace == d.mapping.Schema && m.Name == d.mapping.Table) {
		return ""
	}
	d.renamed = true
	return fmt.Sprintf("the outbox table %s was renamed or moved to %s (same table, OID %d): its inserts are still published, "+
		"but their rows cannot be marked published_at and the next start refuses to stream; set CDCRELAY_TABLE=%s and restart, or rename it back",
		pgx.Identifier{d.mapping.Schema, d.mapping.Table}.Sanitize(), pgx.Identifier{m.Namespace, m.Name}.Sanitize(), m.ID,
		pgx.Identifier{m.Namespace, m.Name}.Sanitize())
}

func (d *Decoder) insert(m *insertMsg) (step, error) {
	if !d.open {
		return step{}, fmt.Errorf("%w: insert outside a transaction", ErrProtocol)
	}
	rel, ok := d.relations[m.RelationID]
	if !ok {
		return step{}, fmt.Errorf("%w: insert into relation %d before its relation message", ErrSchema, m.RelationID)
	}
	if !rel.outbox {
		return d.other(m.RelationID, rel)
	}
	if rel.problem != nil {
		return step{}, rel.problem
	}
	if len(m.Tuple) != rel.columns {
		return step{}, fmt.Errorf("%w: row has %d columns, relation has %d", ErrSchema, len(m.Tuple), rel.columns)
	}
	ev := Event{CommitLSN: d.begin.FinalLSN, CommitTime: d.begin.CommitTime, Index: d.index, Xid: d.begin.Xid, PayloadIsJSON: rel.payloadIsJSON}
	var err error
	// Without an id the row cannot even be parked: stop.
	if ev.ID, err = d.text(m.Tuple, rel.id, d.mapping.IDColumn); err != nil {
		return step{}, fmt.Errorf("%w: %w", ErrSchema, err)
	}
	// An oversize row is judged before it is copied: it already sits once
	// in the receive buffer, and a copy would double that for a row that
	// can only be parked. Only its id is kept, and its routing key when
	// that is short enough to route its dead-letter copy (longer keys are
	// never sent: an AMQP short string).
	if reason := d.oversize(m.Tuple, rel); reason != "" {
		ev.Problem = reason
		if v := m.Tuple[rel.key]; v.Kind == 't' && len(v.Data) <= keptKeyMax {
			ev.RoutingKey = string(v.Data)
		}
		d.index++
		return step{Kind: stepEvent, Event: ev}, nil
	}
	// A row with an id but a NULL routing key or payload is poison, not a
	// broken stream: it is reported with its id and the stream goes on.
	if ev.RoutingKey, err = d.text(m.Tuple, rel.key, d.mapping.RoutingKeyColumn); err != nil {
		ev.Problem = err.Error()
	}
	// The tuple aliases the connection's read buffer, which the next receive
	// overwrites: copy what the event keeps.
	if payload := m.Tuple[rel.payload]; payload.Kind == 't' {
		ev.Payload = append([]byte(nil), payload.Data...)
	} else if ev.Problem == "" {
		ev.Problem = fmt.Sprintf("column %q is %s", d.mapping.PayloadColumn, describe(payload.Kind))
	}
	ev.Headers = optional(m.Tuple, rel.headers)
	ev.Exchange = string(optional(m.Tuple, rel.exchange))
	ev.Type = string(optional(m.Tuple, rel.msgType))
	d.index++
	return step{Kind: stepEvent, Event: ev}, nil
}

// other handles an insert from a relation that is not the outbox: a
// foreign one is skipped (noticed once per relation and session); the
// outbox's name under another OID stops the relay; any other ends the
// session unconfirmed, for the next start to classify it.
func (d *Decoder) other(oid uint32, rel *relation) (step, error) {
	switch {
	case rel.foreign:
		step := step{Skipped: true}
		if !d.skipped[oid] {
			d.skipped[oid] = true
			step.Notice = fmt.Sprintf("skipping inserts into %s (relation %d): the relay's publication publishes it, but it is not the outbox table %s; "+
				"remove it from the publication (ALTER PUBLICATION … DROP TABLE) to spare the walsender decoding them",
				rel.name, oid, pgx.Identifier{d.mapping.Schema, d.mapping.Table}.Sanitize())
		}
		return step, nil
	case rel.recreated:
		return step{}, fmt.Errorf("%w: %s (relation %d) has the outbox table's name but is not the table the session started with (dropped and created again?): "+
			"nothing past it is confirmed; check that the new table is the outbox and that the publication publishes it (cdcrelay check), then start the relay again",
			ErrNotOutbox, rel.name, oid)
	}
	return step{}, &RelationUnknownError{OID: oid, Name: rel.name}
}

// keptKeyMax is the longest routing key an oversize row keeps: AMQP's
// short string, the most a routing key can be.
const keptKeyMax = 255

// oversize says why a row is too large to publish, or "" when it is not.
func (d *Decoder) oversize(tuple []tupleValue, rel *relation) string {
	limit := d.mapping.MaxMessageBytes
	if limit <= 0 {
		return ""
	}
	if n := len(tuple[rel.payload].Data); int64(n) > limit {
		return fmt.Sprintf("payload is %d bytes, above CDCRELAY_MAX_MESSAGE_BYTES (%d)", n, limit)
	}
	// The columns the message is built from; others (a large column the
	// relay never reads) cost nothing more and make no row unsendable.
	n := 0
	for _, at := range []int{rel.id, rel.key, rel.payload, rel.headers, rel.exchange, rel.msgType} {
		if at >= 0 {
			n += len(tuple[at].Data)
		}
	}
	if int64(n) > limit {
		return fmt.Sprintf("row is %d bytes, above CDCRELAY_MAX_MESSAGE_BYTES (%d)", n, limit)
	}
	return ""
}

func (d *Decoder) text(tuple []tupleValue, at int, name string) (string, error) {
	v := tuple[at]
	if v.Kind != 't' {
		return "", fmt.Errorf("column %q is %s", name, describe(v.Kind))
	}
	return string(v.Data), nil
}

func optional(tuple []tupleValue, at int) []byte {
	if at < 0 || tuple[at].Kind != 't' {
		return nil
	}
	return append([]byte(nil), tuple[at].Data...)
}

func describe(kind byte) string {
	switch kind {
	case 'n':
		return "NULL"
	case 'u':
		return "an unchanged TOAST value"
	case 'b':
		return "in binary format"
	}
	return fmt.Sprintf("of unknown kind %q", kind)
}
