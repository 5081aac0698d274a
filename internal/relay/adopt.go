package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sync/errgroup"

	"github.com/cdcrelay/cdcrelay/internal/publish"
	"github.com/cdcrelay/cdcrelay/internal/slot"
	"github.com/cdcrelay/cdcrelay/internal/wal"
)

// adopt creates the slot and publishes every row with published_at IS NULL
// from its exported snapshot before streaming starts (docs/architecture.md invariant
// 7). It returns the slot's consistent point. db is the primary, sdb the
// server that holds the slot (the same connection without
// CDCRELAY_REPLICATION_URL): the marker, the slot and the snapshot's
// backlog are on sdb, the marks go to the primary through the janitor.
func (r *Relay) adopt(ctx context.Context, db, sdb *pgx.Conn, repl *pgconn.PgConn, link *publish.Link, locked bool) (pglogrepl.LSN, error) {
	if !locked {
		if err := slot.BeginAdoption(ctx, sdb, r.cfg.Slot); err != nil {
			return 0, err
		}
	}
	created, err := r.createSlot(ctx, db, sdb, repl)
	if err != nil {
		return 0, err
	}
	r.metrics.backfilling.Set(1)
	defer r.metrics.backfilling.Set(0)
	// A new slot is a new stream: nothing remembered of the old one applies.
	r.resume.Forget()
	r.log.Info("created replication slot; publishing the rows committed before it", "consistent_point", created.ConsistentPoint)
	began := time.Now()
	seq := slot.NewWatermark(0)
	rows := make(chan wal.Event)
	events := make(chan wal.Event, eventBuffer)
	var n int
	// A stop ends the adoption at once, even a publish blocked in a socket
	// write (invariant 5, docs/architecture.md); it starts again next time.
	defer context.AfterFunc(ctx, link.Abort)()
	g, gctx := errgroup.WithContext(ctx)
	// Each confirm counts at once, so the counter shows the adoption's progress.
	r.metrics.backfillRows.Set(0)
	r.metrics.backfillDone.Set(0)
	marks := r.janitor.Session(gctx, seq, r.metrics.backfilled, r.metrics.backfillDone)
	budget := r.newBudget()
	publisher := publish.NewPublisher(link, events, marks, budget, r.publisherConfig())
	g.Go(func() error {
		var err error
		// The exported snapshot is the slot server's: a standby's cannot
		// be imported on the primary.
		n, err = slot.Backfill(gctx, sdb, created, r.mapping, seq, rows, func(n int64) { r.metrics.backfillRows.Set(float64(n)) })
		return err
	})
	g.Go(func() error { return r.budgeted(gctx, budget, rows, events) })
	g.Go(func() error { return publisher.Run(gctx) })
	if err := g.Wait(); err != nil {
		// The next adoption publishes the backlog one message at a time for
		// a while if the broker refused one (publish.Resume): a refusal then
		// names its row.
		r.resume.Failed(wal.Place{}, false, publish.Refusal(err))
		return 0, fmt.Errorf("publish backlog: %w", err)
	}
	// The backlog's rows are behind the slot's consistent point: they must
	// be marked before the adoption ends (invariant 10, docs/architecture.md).
	if err := marks.Wait(ctx); err != nil {
		return 0, err
	}
	if err := slot.EndAdoption(ctx, sdb, r.cfg.Slot); err != nil {
		return 0, err
	}
	r.log.Info("published the backlog", "events", n, "took", time.Since(began).Round(time.Millisecond))
	return created.ConsistentPoint, nil
}
