package config

import (
	"slices"
	"strings"
	"testing"
)

func TestKnownFollowsConfig(t *testing.T) {
	known := Known()
	if len(known) != len(keys()) {
		t.Fatalf("Known has %d names, Config %d fields", len(known), len(keys()))
	}
	for _, want := range []string{"CDCRELAY_DATABASE_URL", "CDCRELAY_POISON", "CDCRELAY_HTTP_ADDR", "CDCRELAY_AMQP_TLS_KEY", "CDCRELAY_LOG_FORMAT"} {
		if !slices.Contains(known, want) {
			t.Errorf("Known lacks %s: %v", want, known)
		}
	}
	if !slices.IsSorted(known) {
		t.Errorf("Known is not sorted: %v", known)
	}
}

func TestUnknown(t *testing.T) {
	for _, tc := range []struct {
		name    string
		environ []string
		extra   []string
		want    []string
	}{
		{"none", []string{"PATH=/bin", "CDCRELAY_SLOT=x", "CDCRELAY_POISON=stop"}, nil, nil},
		{"typo", []string{"CDCRELAY_POISSON=stop"}, nil, []string{"CDCRELAY_POISSON (did you mean CDCRELAY_POISON?)"}},
		{"uri for url", []string{"CDCRELAY_DATABASE_URI=postgres://x"}, nil, []string{"CDCRELAY_DATABASE_URI (did you mean CDCRELAY_DATABASE_URL?)"}},
		{"lower case", []string{"cdcrelay_slot=x"}, nil, []string{"cdcrelay_slot (did you mean CDCRELAY_SLOT?)"}},
		{"far from any", []string{"CDCRELAY_COLOUR_SCHEME=dark"}, nil, []string{"CDCRELAY_COLOUR_SCHEME"}},
		{"sorted, once", []string{"CDCRELAY_ZZZZZZZZ=1", "CDCRELAY_RETENTON=1d", "CDCRELAY_ZZZZZZZZ=2"}, nil,
			[]string{"CDCRELAY_RETENTON (did you mean CDCRELAY_RETENTION?)", "CDCRELAY_ZZZZZZZZ"}},
		{"extra accepted", []string{"CDCRELAY_FAILPOINT=publish.after-publish"}, []string{"CDCRELAY_FAILPOINT"}, nil},
		{"other prefix", []string{"CDCRELAYX=1", "XCDCRELAY_SLOT=1"}, nil, nil},
		{"empty value", []string{"CDCRELAY_MAX_INFLIGHT="}, nil, []string{"CDCRELAY_MAX_INFLIGHT (did you mean CDCRELAY_MAX_IN_FLIGHT?)"}},
		{"kubernetes service links", []string{"CDCRELAY_SERVICE_HOST=10.0.0.1", "CDCRELAY_SERVICE_PORT=8080", "CDCRELAY_SERVICE_PORT_HTTP=8080",
			"CDCRELAY_PORT=tcp://10.0.0.1:8080", "CDCRELAY_PORT_8080_TCP=tcp://10.0.0.1:8080", "CDCRELAY_PORT_8080_TCP_PROTO=tcp",
			"CDCRELAY_PORT_8080_TCP_PORT=8080", "CDCRELAY_PORT_8080_TCP_ADDR=10.0.0.1"}, nil, nil},
		{"service-link look-alike", []string{"CDCRELAY_PORTS=1"}, nil, []string{"CDCRELAY_PORTS"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, u := range Unknown(tc.environ, tc.extra...) {
				got = append(got, u.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Unknown(%v) = %q, want %q", tc.environ, got, tc.want)
			}
		})
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"POISON", "POISON", 0}, {"POISSON", "POISON", 1}, {"SLOT", "", 4}, {"KITTEN", "SITTING", 3}} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestHTTPAddr(t *testing.T) {
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{":8080", true}, {"0.0.0.0:8080", true}, {"localhost:9090", true}, {"[::1]:8080", true}, {":0", true}, {":65535", true},
		{"8080", false}, {":65536", false}, {":http", false}, {":-1", false}, {":+80", false}, {"", false}, {":", false},
		{"host:80:90", false}, {"a b:80", false},
	} {
		_, err := load(t, map[string]string{"DATABASE_URL": "postgres://u@db/app", "HTTP_ADDR": tc.addr})
		if tc.ok && err != nil {
			t.Errorf("HTTP_ADDR %q: %v", tc.addr, err)
		}
		if !tc.ok && (err == nil || !strings.HasPrefix(err.Error(), "CDCRELAY_HTTP_ADDR: ")) {
			t.Errorf("HTTP_ADDR %q: want one CDCRELAY_HTTP_ADDR problem, got %v", tc.addr, err)
		}
	}
}
