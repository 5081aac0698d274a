package pgcluster

import "testing"

func TestVersionLess(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"9.6", "15", true},
		{"15", "9.6", false},
		{"14", "15", true},
		{"16", "15", false},
		{"15", "15", false},
	} {
		if got := versionLess(c.a, c.b); got != c.want {
			t.Errorf("versionLess(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestParseMajor(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{
		"postgres (PostgreSQL) 15.20 (Debian 15.20-0+deb12u1)\n": 15,
		"postgres (PostgreSQL) 13.23\n":                          13,
		"postgres (PostgreSQL) 18beta1\n":                        18,
		"postgres (PostgreSQL) 10.1":                             10,
	} {
		if got, err := parseMajor(in); err != nil || got != want {
			t.Errorf("parseMajor(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "postgres", "postgres (PostgreSQL) x", "postgres (PostgreSQL) 9.6.3"} {
		if got, err := parseMajor(in); err == nil {
			t.Errorf("parseMajor(%q) = %d, want an error", in, got)
		}
	}
}
