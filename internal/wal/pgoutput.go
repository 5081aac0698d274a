package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// This file is a pure parser for the pgoutput protocol, version 1: bytes in,
// typed messages out, no I/O. It is written here rather than taken from
// pglogrepl.Parse because the relay must survive any byte string the server
// (or a fuzzer) hands it: every read is bounds-checked and a short or corrupt
// message is an error, never a panic.

// ErrUnsupported marks a message the relay cannot handle safely (streamed or
// two-phase transactions, unknown message types). The stream must stop
// without confirming past it.
var ErrUnsupported = errors.New("unsupported pgoutput message")

// ErrMalformed marks a message whose bytes do not match its declared shape.
var ErrMalformed = errors.New("malformed pgoutput message")

// beginMsg starts a transaction. FinalLSN is the LSN of its commit record.
type beginMsg struct {
	FinalLSN   pglogrepl.LSN
	CommitTime time.Time
	Xid        uint32
}

// commitMsg ends a transaction. TransactionEndLSN is the position to confirm
// once every event of the transaction is acknowledged.
type commitMsg struct {
	CommitLSN         pglogrepl.LSN
	TransactionEndLSN pglogrepl.LSN
	CommitTime        time.Time
}

// relColumn describes one column of a relation.
type relColumn struct {
	Name     string
	TypeOID  uint32
	Modifier int32
	Key      bool
}

// relationMsg describes a table; the server sends it before the first change
// to the table in a session and again after every schema change.
type relationMsg struct {
	ID        uint32
	Namespace string
	Name      string
	Columns   []relColumn
}

// tupleValue is one column of a tuple.
type tupleValue struct {
	Kind byte // 'n' null, 'u' unchanged TOAST, 't' text, 'b' binary
	Data []byte
}

// insertMsg is a new row. Tuple values alias the message buffer.
type insertMsg struct {
	RelationID uint32
	Tuple      []tupleValue
}

// ignoredMsg is a message that carries nothing for the relay (update, delete,
// truncate, type, origin, logical decoding message).
type ignoredMsg struct{ Type byte }

// message is one of beginMsg, commitMsg, relationMsg, insertMsg or ignoredMsg.
type message interface{ isMessage() }

func (*beginMsg) isMessage()    {}
func (*commitMsg) isMessage()   {}
func (*relationMsg) isMessage() {}
func (*insertMsg) isMessage()   {}
func (*ignoredMsg) isMessage()  {}

// pgEpoch is 2000-01-01, the origin of PostgreSQL timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// parseMessage decodes one pgoutput (proto_version 1) message.
func parseMessage(data []byte) (message, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: empty message", ErrMalformed)
	}
	r := reader{buf: data[1:]}
	var m message
	switch t := data[0]; t {
	case 'B':
		m = &beginMsg{FinalLSN: r.lsn(), CommitTime: r.time(), Xid: r.u32()}
	case 'C':
		r.u8() // flags, unused
		m = &commitMsg{CommitLSN: r.lsn(), TransactionEndLSN: r.lsn(), CommitTime: r.time()}
	case 'R':
		m = parseRelation(&r)
	case 'I':
		m = parseInsert(&r)
	case 'U', 'D', 'T', 'Y', 'O', 'M':
		return &ignoredMsg{Type: t}, nil
	case 'S', 'E', 'c', 'A':
		return nil, fmt.Errorf("%w: streamed transaction message %q (the relay starts replication with streaming off)", ErrUnsupported, t)
	case 'b', 'P', 'K', 'r', 'p':
		return nil, fmt.Errorf("%w: two-phase message %q (the relay starts replication with two_phase off)", ErrUnsupported, t)
	default:
		return nil, fmt.Errorf("%w: message type %q", ErrUnsupported, t)
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: %q message: %w", ErrMalformed, data[0], r.err)
	}
	return m, nil
}

func parseRelation(r *reader) *relationMsg {
	rel := &relationMsg{ID: r.u32(), Namespace: r.str(), Name: r.str()}
	r.u8() // replica identity setting
	n := int(r.u16())
	if r.err != nil {
		return rel
	}
	// Each column needs at least 10 bytes; refuse counts the buffer cannot hold
	// so a corrupt count cannot make us allocate gigabytes.
	if n*10 > len(r.buf) {
		r.fail("relation declares %d columns in %d bytes", n, len(r.buf))
		return rel
	}
	rel.Columns = make([]relColumn, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		flags := r.u8()
		rel.Columns = append(rel.Columns, relColumn{Key: flags&1 == 1, Name: r.str(), TypeOID: r.u32(), Modifier: int32(r.u32())})
	}
	return rel
}

func parseInsert(r *reader) *insertMsg {
	ins := &insertMsg{RelationID: r.u32()}
	if kind := r.u8(); r.err == nil && kind != 'N' {
		r.fail("insert tuple marker %q, want 'N'", kind)
	}
	n := int(r.u16())
	if r.err != nil {
		return ins
	}
	if n > len(r.buf) { // each value needs at least its kind byte
		r.fail("tuple declares %d values in %d bytes", n, len(r.buf))
		return ins
	}
	ins.Tuple = make([]tupleValue, n)
	for i := range ins.Tuple {
		v := tupleValue{Kind: r.u8()}
		switch v.Kind {
		case 'n', 'u':
		case 't', 'b':
			v.Data = r.take(int(r.u32()))
		default:
			r.fail("tuple value kind %q", v.Kind)
		}
		if r.err != nil {
			return ins
		}
		ins.Tuple[i] = v
	}
	return ins
}

// reader consumes a big-endian buffer; the first short read sets err and
// every later read returns zero values, so parsers check err once at the end.
type reader struct {
	buf []byte
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.buf) {
		r.fail("need %d bytes, have %d", n, len(r.buf))
		return nil
	}
	b := r.buf[:n:n]
	r.buf = r.buf[n:]
	return b
}

func (r *reader) u8() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *reader) lsn() pglogrepl.LSN { return pglogrepl.LSN(r.u64()) }

func (r *reader) time() time.Time {
	return pgEpoch.Add(time.Duration(int64(r.u64())) * time.Microsecond)
}

// str reads a NUL-terminated string.
func (r *reader) str() string {
	if r.err != nil {
		return ""
	}
	for i, c := range r.buf {
		if c == 0 {
			s := string(r.buf[:i])
			r.buf = r.buf[i+1:]
			return s
		}
	}
	r.fail("unterminated string")
	return ""
}
