package main

import (
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/config"
)

// newLogger is the text or JSON logger of CDCRELAY_LOG_FORMAT, each line
// with the database it works on.
func newLogger(cfg config.Config, stderr io.Writer) *slog.Logger {
	level, _ := cfg.Level()
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: replaceAttr}
	var h slog.Handler = slog.NewTextHandler(stderr, opts)
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(stderr, opts)
	}
	db := "?"
	if pc, err := pgx.ParseConfig(cfg.DatabaseURL); err == nil {
		db = pc.Database
	}
	return slog.New(h).With("database", db)
}

// replaceAttr writes durations and LSNs as the docs and PostgreSQL do,
// "98ms" and "0/194D420", in both formats: the JSON handler would write
// nanoseconds and the LSN's decimal integer.
func replaceAttr(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindDuration:
		return slog.String(a.Key, a.Value.Duration().String())
	case slog.KindAny:
		switch v := a.Value.Any().(type) {
		case pglogrepl.LSN:
			return slog.String(a.Key, v.String())
		case time.Duration: // a duration inside an Any value
			return slog.String(a.Key, v.String())
		}
	}
	return a
}
