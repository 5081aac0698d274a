package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

func TestReplaceAttr(t *testing.T) {
	cases := []struct {
		in   slog.Attr
		want slog.Value
	}{
		{slog.Duration("retry_in", 98*time.Millisecond), slog.StringValue("98ms")},
		{slog.Any("took", 90*time.Second), slog.StringValue("1m30s")},
		{slog.Any("consistent_point", pglogrepl.LSN(26530848)), slog.StringValue("0/194D420")},
		{slog.Int("events", 3), slog.IntValue(3)},
		{slog.String("slot", "cdcrelay_outbox"), slog.StringValue("cdcrelay_outbox")},
	}
	for _, c := range cases {
		got := replaceAttr(nil, c.in)
		if got.Key != c.in.Key || !got.Value.Equal(c.want) {
			t.Errorf("replaceAttr(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestLogFormatsWriteDurationsAndLSNs: both formats write what the docs show.
func TestLogFormatsWriteDurationsAndLSNs(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		log := newLogger(config.Config{DatabaseURL: "postgres://u@db/orders", LogLevel: "info", LogFormat: format}, &buf)
		log.Info("x", "retry_in", 98*time.Millisecond, "consistent_point", pglogrepl.LSN(26530848))
		out := buf.String()
		if format == "json" {
			var m map[string]any
			if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
				t.Fatal(err)
			}
			if m["retry_in"] != "98ms" || m["consistent_point"] != "0/194D420" || m["database"] != "orders" {
				t.Errorf("json: %s", out)
			}
			continue
		}
		for _, want := range []string{"retry_in=98ms", "consistent_point=0/194D420", "database=orders"} {
			if !strings.Contains(out, want) {
				t.Errorf("text lacks %s: %s", want, out)
			}
		}
	}
}
