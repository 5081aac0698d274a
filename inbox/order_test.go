package inbox

import (
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
		{"relay headers", amqp.Table{HeaderCommitLSN: "0/16B3748", HeaderTxIndex: int64(4)}, Position{0x16B3748, 4, true}},
		{"index as int32", amqp.Table{HeaderCommitLSN: "1/0", HeaderTxIndex: int32(2)}, Position{1 << 32, 2, true}},
		{"no headers", nil, Position{}},
		{"no index", amqp.Table{HeaderCommitLSN: "0/1"}, Position{}},
		{"bad LSN", amqp.Table{HeaderCommitLSN: "x", HeaderTxIndex: int64(0)}, Position{}},
		{"negative index", amqp.Table{HeaderCommitLSN: "0/1", HeaderTxIndex: int64(-1)}, Position{}},
		{"index as string", amqp.Table{HeaderCommitLSN: "0/1", HeaderTxIndex: "1"}, Position{}},
	}
	for _, c := range cases {
		if got := positionOf(c.h); got != c.want {
			t.Errorf("%s: positionOf = %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestClassify(t *testing.T) {
	p := func(lsn uint64, i int64) Position { return Position{lsn, i, true} }
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
