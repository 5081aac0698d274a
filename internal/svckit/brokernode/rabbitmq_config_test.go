package brokernode

import (
	"maps"
	"testing"
)

func TestParseRabbitMQConfig(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    map[string]string
		wantErr bool
	}{
		{"", map[string]string{}, false},
		{"a = 1", map[string]string{"a": "1"}, false},
		{"deprecated_features.permit.transient_nonexcl_queues = false; log.file.level=debug;",
			map[string]string{"deprecated_features.permit.transient_nonexcl_queues": "false", "log.file.level": "debug"}, false},
		{"a = 1\nb = x=y", map[string]string{"a": "1", "b": "x=y"}, false},
		{"a", nil, true},
		{"a = ", nil, true},
		{" = 1", nil, true},
	} {
		got, err := parseRabbitMQConfig(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("parseRabbitMQConfig(%q) error = %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if !tc.wantErr && !maps.Equal(got, tc.want) {
			t.Errorf("parseRabbitMQConfig(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
