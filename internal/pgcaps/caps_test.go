package pgcaps

import "testing"

// TestCapsByVersion derives every capability for each major the relay
// supports, and for a future one, on a primary and on a standby.
func TestCapsByVersion(t *testing.T) {
	type want struct {
		sessionTimeouts, columnLists, originNone, onStandby, failoverSlots, generated bool
	}
	cases := []struct {
		version int
		want    want
	}{
		{130023, want{}},
		{140019, want{sessionTimeouts: true}},
		{150014, want{sessionTimeouts: true, columnLists: true}},
		{160014, want{true, true, true, true, false, false}},
		{170010, want{true, true, true, true, true, false}},
		{180004, want{true, true, true, true, true, true}},
		{190000, want{true, true, true, true, true, true}},
	}
	for _, tc := range cases {
		for _, standby := range []bool{false, true} {
			c := Caps{Version: tc.version, InRecovery: standby}
			got := want{c.SessionTimeouts(), c.PublicationColumnLists(), c.OriginNone(), c.DecodesOnStandby(), c.FailoverSlots(), c.PublishesGenerated()}
			if got != tc.want {
				t.Errorf("%s: got %+v, want %+v", c, got, tc.want)
			}
			if can := tc.want.failoverSlots && !standby; c.CanFailover() != can {
				t.Errorf("%s: CanFailover %v, want %v", c, c.CanFailover(), can)
			}
		}
	}
}

// TestCapsBoundaries: each capability starts at its release's first
// number, not one before.
func TestCapsBoundaries(t *testing.T) {
	for _, tc := range []struct {
		name string
		has  func(Caps) bool
		from int
	}{
		{"SessionTimeouts", Caps.SessionTimeouts, 140000},
		{"PublicationColumnLists", Caps.PublicationColumnLists, 150000},
		{"OriginNone", Caps.OriginNone, 160000},
		{"DecodesOnStandby", Caps.DecodesOnStandby, 160000},
		{"FailoverSlots", Caps.FailoverSlots, 170000},
		{"CanFailover", Caps.CanFailover, 170000},
		{"PublishesGenerated", Caps.PublishesGenerated, 180000},
	} {
		if tc.has(Caps{Version: tc.from - 1}) || !tc.has(Caps{Version: tc.from}) {
			t.Errorf("%s: want false at %d and true at %d", tc.name, tc.from-1, tc.from)
		}
	}
}

// TestFromServerVersion reads the major out of the server_version
// parameter as the server reports it at connection start.
func TestFromServerVersion(t *testing.T) {
	for v, want := range map[string]int{
		"13.23": 130000, "14.9": 140000, "15.4": 150000, "17.2 (Debian 17.2-1.pgdg120+1)": 170000,
		"18.4": 180000, "19devel": 190000, "": 0, "x": 0,
	} {
		c := FromServerVersion(v)
		if c.Version != want || c.InRecovery {
			t.Errorf("FromServerVersion(%q) = %+v, want version %d on a primary", v, c, want)
		}
		if c.SessionTimeouts() != (want >= 140000) {
			t.Errorf("FromServerVersion(%q).SessionTimeouts() = %v", v, c.SessionTimeouts())
		}
	}
}

// TestServer: failover slots need 17+ and a primary; versions print as
// PostgreSQL names them.
func TestServer(t *testing.T) {
	for _, c := range []struct {
		s    Caps
		can  bool
		text string
	}{
		{Caps{Version: 170010}, true, "PostgreSQL 17.10 (primary)"},
		{Caps{Version: 180004, InRecovery: true}, false, "PostgreSQL 18.4 (standby)"},
		{Caps{Version: 160014}, false, "PostgreSQL 16.14 (primary)"},
		{Caps{Version: 130023}, false, "PostgreSQL 13.23 (primary)"},
		{Caps{Version: 90624}, false, "PostgreSQL 9.6.24 (primary)"},
	} {
		if c.s.CanFailover() != c.can || c.s.String() != c.text {
			t.Errorf("%+v: CanFailover %v, String %q; want %v, %q", c.s, c.s.CanFailover(), c.s.String(), c.can, c.text)
		}
	}
}
