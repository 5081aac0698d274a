package inbox

import (
	"math"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestParseLSN(t *testing.T) {
	for in, want := range map[string]uint64{
		"0/0":               0,
		"0/1A2B3C":          0x1A2B3C,
		"16/B374D848":       0x16_B374D848,
		"FFFFFFFF/FFFFFFFF": ^uint64(0),
	} {
		got, err := parseLSN(in)
		if err != nil || got != want {
			t.Errorf("parseLSN(%q) = %x, %v; want %x", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "/1", "1/", "1/2/3", "G/1", "-1/2", "100000000/0", "0x1/2"} {
		if got, err := parseLSN(bad); err == nil {
			t.Errorf("parseLSN(%q) = %x, want an error", bad, got)
		}
	}
}

// FuzzParseLSN: every LSN parseLSN accepts prints back (LSNText) to a text
// it parses to the same value.
func FuzzParseLSN(f *testing.F) {
	for _, s := range []string{"0/0", "0/1A2B3C", "16/B374D848", "ffffffff/0", "00/01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		lsn, err := parseLSN(s)
		if err != nil {
			return
		}
		p := Position{CommitLSN: lsn, Valid: true}
		again, err := parseLSN(p.LSNText())
		if err != nil || again != lsn {
			t.Fatalf("%q -> %x -> %q -> %x, %v", s, lsn, p.LSNText(), again, err)
		}
	})
}

func TestPositionOf(t *testing.T) {
	cases := []struct {
		name string
		h    amqp.Table
		want Position
	}{
		{"relay headers", amqp.Table{HeaderCommitLSN: "0/16B3748", HeaderTxIndex: int64(4), HeaderTimeline: int64(3)}, Position{3, 0x16B3748, 4, true}},
		{"no timeline (an older relay)", amqp.Table{HeaderCommitLSN: "0/16B3748", HeaderTxIndex: int64(4)}, Position{0, 0x16B3748, 4, true}},
		{"index and timeline as int32", amqp.Table{HeaderCommitLSN: "1/0", HeaderTxIndex: int32(2), HeaderTimeline: int32(2)}, Position{2, 1 << 32, 2, true}},
		{"the largest timeline", amqp.Table{HeaderCommitLSN: "0/1", HeaderTxIndex: int64(0), HeaderTimeline: int64(math.MaxUint32)}, Position{math.MaxUint32, 1, 0, true}},
		{"timeline 0", amqp.Table{HeaderCommitLSN: "0/1", HeaderTxIndex: int64(0), HeaderTimeline: int64(0)}, Position{0, 1, 0, true}},
		{"negative timeline", amqp.Table{HeaderCommitLSN: "0/1", HeaderTxIndex: int64(0), HeaderTimeline: int64(-2)}, Position{0, 1, 0, true}},
		{"timeline beyond 32 bits", amqp.Table{HeaderCommitLSN: "0/1", HeaderTxIndex: int64(0), HeaderTimeline: int64(1 << 32)}, Position{0, 1, 0, true}},
		{"timeline as string", amqp.Table{HeaderCommitLSN: "0/1", HeaderTxIndex: int64(0), HeaderTimeline: "2"}, Position{0, 1, 0, true}},
		{"timeline without a pair", amqp.Table{HeaderTimeline: int64(2)}, Position{}},
		{"no headers", nil, Position{}},
		{"no index", amqp.Table{HeaderCommitLSN: "0/1"}, Position{}},
		{"bad LSN", amqp.Table{HeaderCommitLSN: "x", HeaderTxIndex: int64(0)}, Position{}},
		{"negative index", amqp.Table{HeaderCommitLSN: "0/1", HeaderTxIndex: int64(-1)}, Position{}},
		{"index as string", amqp.Table{HeaderCommitLSN: "0/1", HeaderTxIndex: "1"}, Position{}},
	}
	for _, c := range cases {
		if got := PositionOf(c.h); got != c.want {
			t.Errorf("%s: positionOf = %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestClassify(t *testing.T) {
	p := func(lsn uint64, i int64) Position { return Position{0, lsn, i, true} }
	cases := []struct {
		pos, seen Position
		want      Order
	}{
		{Position{}, p(1, 0), OrderUnknown},
		{p(5, 0), Position{}, OrderFirst},
		{p(5, 1), p(5, 0), OrderNext},
		{p(6, 0), p(5, 9), OrderNext},
		{p(5, 0), p(5, 0), OrderNext}, // the same event, retried
		{p(5, 0), p(5, 1), OrderLate},
		{p(4, 9), p(5, 0), OrderLate},
	}
	for _, c := range cases {
		if got := classify(c.pos, c.seen); got != c.want {
			t.Errorf("classify(%+v, %+v) = %v, want %v", c.pos, c.seen, got, c.want)
		}
	}
}

// TestClassifyAcrossTimelines: after an asynchronous failover the promoted
// standby's timeline reuses LSNs the old primary used for events it never
// received (h48: the greatest pair delivered before the kill 0/1C045D8#0,
// the new slot's snapshot rows at 0/1B4890F#52, a new event on the very
// pair of a phantom). With the timeline header every new event is next,
// never late; without it (older relays) the pairs compare as before.
func TestClassifyAcrossTimelines(t *testing.T) {
	at := func(tl uint32, lsn uint64, i int64) Position { return Position{tl, lsn, i, true} }
	const lastBeforeKill = 0x1C045D8
	cases := []struct {
		name      string
		pos, seen Position
		want      Order
	}{
		{"a snapshot row of the promoted node below the old timeline's last pair", at(2, 0x1B4890F, 52), at(1, lastBeforeKill, 0), OrderNext},
		{"a new event on the pair of a phantom of the old primary", at(2, lastBeforeKill, 0), at(1, lastBeforeKill, 0), OrderNext},
		{"a new event above the old timeline's last pair", at(2, lastBeforeKill+0x100, 0), at(1, lastBeforeKill, 0), OrderNext},
		{"a new event two promotions later", at(4, 0x100, 0), at(2, lastBeforeKill, 7), OrderNext},
		{"an old timeline's event after the new timeline's", at(1, lastBeforeKill, 0), at(2, 0x1B4890F, 52), OrderLate},
		{"an old timeline's event at a greater LSN", at(1, lastBeforeKill+0x100, 0), at(2, 0x1B4890F, 52), OrderLate},
		{"within one timeline, by pair", at(2, 0x1B48910, 0), at(2, 0x1B4890F, 52), OrderNext},
		{"within one timeline, late by pair", at(2, 0x1B4890F, 51), at(2, 0x1B4890F, 52), OrderLate},
		// Equal triples: the same event again (Attempt above 1); the ledger,
		// not the order, tells two message_ids apart.
		{"equal triples", at(2, lastBeforeKill, 0), at(2, lastBeforeKill, 0), OrderNext},
		// Equal pairs without timelines (an older relay): two events can
		// share a pair across a promotion and the inbox cannot tell.
		{"equal pairs, no timelines", at(0, lastBeforeKill, 0), at(0, lastBeforeKill, 0), OrderNext},
		{"no timeline on the new event: by pair, as before", at(0, 0x1B4890F, 52), at(1, lastBeforeKill, 0), OrderLate},
		{"no timeline on the seen event: by pair, as before", at(2, 0x1B4890F, 52), at(0, lastBeforeKill, 0), OrderLate},
		{"a relay rolled back on one timeline: by pair", at(0, lastBeforeKill+1, 0), at(1, lastBeforeKill, 0), OrderNext},
		{"a relay upgraded on one timeline: by pair", at(1, lastBeforeKill+1, 0), at(0, lastBeforeKill, 0), OrderNext},
		{"no commit LSN and index", Position{Timeline: 2}, at(1, lastBeforeKill, 0), OrderUnknown},
		{"the first of its key", at(2, 0x100, 0), Position{}, OrderFirst},
	}
	for _, c := range cases {
		if got := classify(c.pos, c.seen); got != c.want {
			t.Errorf("%s: classify(%+v, %+v) = %v, want %v", c.name, c.pos, c.seen, got, c.want)
		}
	}
}
