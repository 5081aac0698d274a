package main

// The standby part's table layout (-standby-layout): the relay's phases on
// the default schema (migrations/*.sql, whose partial indexes name
// published_at, so every mark is a full update) or on the HOT layout
// (migrations/optional/hot_marks.sql: no index names published_at,
// fillfactor 50, so a mark can be a heap-only update). The polling
// drainer's reference phases always run on the default layout, the schema
// its users run today. What pg_stat_user_tables counted of the outbox's
// updates, and how many were HOT, is read around every window.

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/toolkit"
	"github.com/cdcrelay/cdcrelay/migrations"
)

// standbyLayout is the outbox's layout during the standby part's relay
// phases.
type standbyLayout string

const (
	layoutDefault standbyLayout = "default"
	layoutHOT     standbyLayout = "hot"
)

// parseStandbyLayout reads -standby-layout.
func parseStandbyLayout(s string) (standbyLayout, error) {
	switch l := standbyLayout(strings.ToLower(strings.TrimSpace(s))); l {
	case layoutDefault, layoutHOT:
		return l, nil
	}
	return "", fmt.Errorf("%q: want default (migrations/*.sql) or hot (also migrations/%s)", s, migrations.HOTFile)
}

// standbyLayoutOption reads -standby-layout against the other options: a
// layout other than the default needs the standby part.
func standbyLayoutOption(s string, opts options) (standbyLayout, error) {
	l, err := parseStandbyLayout(s)
	if err != nil {
		return "", err
	}
	if l != layoutDefault && !opts.standby && !opts.standbyOnly {
		return "", fmt.Errorf("%s applies to the standby part, which -standby=false skips", l)
	}
	return l, nil
}

// label names the layout in the report's heading and target rows.
func (l standbyLayout) label() string {
	if l == layoutHOT {
		return "HOT layout"
	}
	return "default layout"
}

// describe says in a sentence what the layout is.
func (l standbyLayout) describe() string {
	if l == layoutHOT {
		return "the HOT layout (migrations/" + migrations.HOTFile + " applied after the drainer's phases: no index names\n" +
			"published_at, fillfactor 50, so a mark can be a heap-only update)"
	}
	return "the default layout (migrations/*.sql: the partial indexes name published_at, so every mark is a full update)"
}

// applyLayout puts the part's primary on opts' layout for the relay
// phases: nothing for the default one; for hot, migrations.ApplyHOT as the
// table's owner (the superuser that ran migrate), then a check that no
// index names published_at any more. It records the outbox's indexes and
// options as the relay phases see them.
func (b *bench) applyLayout(ctx context.Context, r *standbyResult) error {
	if r.layout == layoutHOT {
		say("standby part: putting the outbox on the HOT layout (migrations.ApplyHOT, %s) for the relay's phases", migrations.HOTFile)
		began := time.Now()
		if err := migrations.ApplyHOT(ctx, b.db, migrations.Default); err != nil {
			return fmt.Errorf("the HOT layout: %w", err)
		}
		say("  applied in %s", time.Since(began).Round(time.Millisecond))
	}
	var err error
	r.indexes, r.reloptions, err = b.outboxLayout(ctx)
	if err != nil {
		return err
	}
	if r.layout == layoutHOT {
		var naming []string
		for _, ix := range r.indexes {
			if strings.Contains(ix, "published_at") {
				naming = append(naming, ix)
			}
		}
		if len(naming) > 0 || !strings.Contains(r.reloptions, "fillfactor=50") {
			return fmt.Errorf("the HOT layout was not applied: indexes naming published_at %v, options %q", naming, r.reloptions)
		}
	}
	return nil
}

// outboxLayout lists the outbox's indexes (pg_get_indexdef, schema
// dropped) and its storage options.
func (b *bench) outboxLayout(ctx context.Context) (indexes []string, reloptions string, err error) {
	err = b.db.QueryRow(ctx, `SELECT coalesce((SELECT array_agg(replace(pg_get_indexdef(i.indexrelid), 'public.', '') ORDER BY i.indexrelid::regclass::text)
			FROM pg_index i WHERE i.indrelid = c.oid), '{}'), coalesce(array_to_string(c.reloptions, ','), '')
		FROM pg_class c WHERE c.oid = 'event_outbox'::regclass`).Scan(&indexes, &reloptions)
	if err != nil {
		return nil, "", fmt.Errorf("read the outbox's indexes: %w", err)
	}
	return indexes, reloptions, nil
}

// updateCounts is what pg_stat_user_tables counted for the outbox on the
// part's primary: updated tuples, and of them heap-only ones.
type updateCounts struct {
	upd, hot int64
	// short is set when fewer updates than marks were counted by the end
	// of updateSettle (a backend's statistics not yet flushed).
	short bool
}

func (u updateCounts) minus(v updateCounts) updateCounts {
	return updateCounts{upd: u.upd - v.upd, hot: u.hot - v.hot}
}

// share is the HOT share of the updates; "n/a" when there were none.
func (u updateCounts) share() string {
	if u.upd <= 0 {
		return "n/a"
	}
	s := fmt.Sprintf("%.1f%%", 100*float64(u.hot)/float64(u.upd))
	if u.short {
		s += " (partial)"
	}
	return s
}

// tupleUpdates reads the outbox's counters. The statistics are those
// backends have flushed: a busy backend flushes at most once a second, an
// idle one within 10 s (PostgreSQL 15+), an exiting one at once.
func (b *bench) tupleUpdates(ctx context.Context) (updateCounts, error) {
	var u updateCounts
	err := b.db.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'event_outbox'::regclass`).Scan(&u.upd, &u.hot)
	if err != nil {
		return u, fmt.Errorf("pg_stat_user_tables: %w", err)
	}
	return u, nil
}

// updateSettle bounds waiting for a window's updates to reach the
// statistics (an idle backend flushes within 10 s).
const updateSettle = 12 * time.Second

// countUpdates runs a window (phase, which returns how many rows it
// marked) between two readings of the outbox's update counters and stores
// the difference in into. Every row is marked once, so the end reading
// waits (updateSettle at most) until the counters show at least that many
// updates; the readings are outside the CPU windows.
func (b *bench) countUpdates(ctx context.Context, into *updateCounts, phase func() (int, error)) error {
	before, err := b.tupleUpdates(ctx)
	if err != nil {
		return err
	}
	marks, err := phase()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(updateSettle)
	for {
		after, err := b.tupleUpdates(ctx)
		if err != nil {
			return err
		}
		d := after.minus(before)
		if d.upd >= int64(marks) || time.Now().After(deadline) {
			d.short = d.upd < int64(marks)
			*into = d
			say("  outbox updates: %s, HOT %s (%s)", toolkit.Thousands(int(d.upd)), toolkit.Thousands(int(d.hot)), d.share())
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// hotNotes reports the outbox's layout during the relay phases and the
// HOT share of its updates in each window.
func (s *standbyResult) hotNotes() string {
	var b strings.Builder
	fmt.Fprintf(&b, "the outbox during the relay's phases: %s;\nfillfactor %s, indexes:\n", s.layout.describe(), orDefault(s.reloptions))
	for _, ix := range s.indexes {
		fmt.Fprintf(&b, "    %s\n", ix)
	}
	b.WriteString("\nthe outbox's updates on the primary in each window (pg_stat_user_tables n_tup_upd, n_tup_hot_upd; the drainer's on\n" +
		"the default layout, the relay's marks on the " + s.layout.label() + "):\n\n")
	rows := make([][]string, 0, 9)
	for _, w := range s.windows() {
		rows = append(rows, []string{w.name, toolkit.Thousands(w.events), toolkit.Thousands(int(w.upd.upd)), toolkit.Thousands(int(w.upd.hot)), w.upd.share()})
	}
	b.WriteString(formatTable([]string{"window", "events", "updates", "HOT updates", "HOT share"}, rows))
	return b.String()
}

func orDefault(reloptions string) string {
	for _, o := range strings.Split(reloptions, ",") {
		if v, ok := strings.CutPrefix(o, "fillfactor="); ok {
			return v
		}
	}
	return "100 (the default)"
}
