package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcrelay/cdcrelay/internal/adoption"
	"github.com/cdcrelay/cdcrelay/internal/progress"
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
// ctx is the session's work; soft ending stops the backlog gracefully,
// lost ending (the slot lock lost) at once (backlog).
func (r *Relay) adopt(ctx, soft, lost context.Context, db, sdb *pgx.Conn, repl *pgconn.PgConn, link *publish.Link, locked bool) (pglogrepl.LSN, error) {
	if !locked {
		if err := adoption.Begin(ctx, sdb, r.cfg.Slot); err != nil {
			return 0, err
		}
	}
	created, err := r.createSlot(ctx, db, sdb, repl)
	if err != nil {
		return 0, err
	}
	r.madeBy(created)
	// A new slot is a new stream: no place remembered of the old one
	// applies. The careful window after a refusal is kept (it is about the
	// broker): a backlog row the broker refused is then published alone
	// next time, and the refusal names it.
	r.carryover.Forget()
	r.log.Info("created replication slot; publishing the rows committed before it", "consistent_point", created.ConsistentPoint)
	return created.ConsistentPoint, r.backlog(ctx, soft, lost, sdb, link, created)
}

// unfinishedAdoption is an adoption this process began and did not finish:
// its slot (by name and consistent point) and the index past the last one
// its attempts gave a backlog row (docs/architecture.md, "What the relay
// remembers").
type unfinishedAdoption struct {
	slot string
	at   pglogrepl.LSN
	next int
	set  bool
}

// resumable reports whether the slot info describes, unfinished, is the
// adoption this process began: same slot, never streamed since (its
// position is still its consistent point).
func (u unfinishedAdoption) resumable(slotName string, info slot.Info) bool {
	return u.set && u.slot == slotName && u.at == info.ConfirmedFlush
}

// resumeAdoption publishes the backlog of a slot whose adoption this
// process began and did not finish (a refusal or a failure ended the
// session), keeping the slot. The slot never streamed, so its position is
// still its consistent point, and its exported snapshot is gone: the
// backlog is read from a new snapshot instead, which holds every row
// committed before that point that is still unpublished, and also those
// committed since (published again when the stream reaches them:
// duplicates, never a gap). Its rows' indices start past the earlier
// attempts', so that no pair names two events. Re-creating the slot
// instead would wait for every running transaction at each retry, and a
// row the broker refuses would make every retry do it.
func (r *Relay) resumeAdoption(ctx, soft, lost context.Context, sdb *pgx.Conn, link *publish.Link, at pglogrepl.LSN) error {
	r.log.Info("publishing the rest of the backlog of the slot's unfinished adoption, from a new snapshot", "consistent_point", at)
	return r.backlog(ctx, soft, lost, sdb, link, slot.Created{ConsistentPoint: at, FirstIndex: r.unfinished.next})
}

// backlog publishes the rows with published_at IS NULL of created's
// snapshot (a new one when it names none), waits for their marks and ends
// the adoption. lost ending (the slot lock lost) stops it at once, even
// during a drain; ctx (the session's work) ends with either. soft ending
// (a stop) stops the snapshot's reading and drains what was sent:
// the broker's confirms arrive and their rows are marked, within
// CDCRELAY_SHUTDOWN_TIMEOUT (pipeline.go), so a next start publishes none
// of them again. The adoption is then unfinished, and the next start
// resumes or redoes it.
func (r *Relay) backlog(ctx, soft, lost context.Context, sdb *pgx.Conn, link *publish.Link, created slot.Created) error {
	r.metrics.backfilling.Set(1)
	defer r.metrics.backfilling.Set(0)
	began := time.Now()
	// Each confirm counts at once, so the counter shows the adoption's progress.
	r.metrics.backfillRows.Set(0)
	r.metrics.backfillDone.Set(0)
	p := r.newPipeline(soft, lost, link, progress.NewWatermark(0), r.metrics.backfilled, r.metrics.backfillDone)
	rows := make(chan wal.Event)
	var n int
	err := p.run(
		func(pctx context.Context) error {
			feed, cancel := p.feedContext()
			defer cancel()
			var err error
			// The exported snapshot is the slot server's: a standby's cannot
			// be imported on the primary.
			n, err = adoption.Backfill(feed, sdb, created, r.mapping, p.watermark, rows, func(n int64) { r.metrics.backfillRows.Set(float64(n)) })
			return p.fed(feed, err)
		},
		func(pctx context.Context) error {
			feed, cancel := p.feedContext()
			defer cancel()
			return p.fed(feed, r.budgeted(feed, p.budget, rows, p.events))
		},
		// The backlog's rows are behind the slot's consistent point: they
		// must be marked before the adoption ends (invariant 10,
		// docs/architecture.md), and before a stop returns.
		func(pctx context.Context) error {
			select {
			case <-p.settled():
				return nil
			case <-pctx.Done():
				return pctx.Err()
			}
		},
	)
	// Until the adoption ends, a next attempt of this process keeps the
	// slot and numbers its rows past every index given so far.
	r.unfinished = unfinishedAdoption{slot: r.cfg.Slot, at: created.ConsistentPoint, next: created.FirstIndex + n, set: true}
	switch {
	case err != nil:
		return r.backlogFailed(ctx, p, err)
	case p.stop.stopped():
		r.log.Info("stopped the adoption; the next start publishes the rest of the backlog", "read", n)
		return fmt.Errorf("publish backlog: stopped after reading %d rows: %w", n, context.Cause(soft))
	}
	if err := adoption.End(ctx, sdb, r.cfg.Slot); err != nil {
		return err
	}
	r.unfinished = unfinishedAdoption{}
	r.log.Info("published the backlog", "events", n, "took", time.Since(began).Round(time.Millisecond))
	return nil
}

// backlogFailed ends an adoption the broker or the database failed: what
// the broker acknowledged is marked before the next attempt reads its
// snapshot, which then leaves it out, so each attempt makes progress and
// publishes again none of it (as windDown does for a stream).
func (r *Relay) backlogFailed(ctx context.Context, p *pipeline, err error) error {
	wctx, cancel := context.WithTimeout(ctx, windDownWait)
	_ = p.marks.Wait(wctx)
	cancel()
	// The next attempt publishes the backlog one message at a time for a
	// while if the broker refused one (publish.Carryover): a refusal then
	// names its row, which is parked or named as stalled.
	r.carryover.Failed(wal.Place{}, false, publish.Refusal(err))
	return fmt.Errorf("publish backlog: %w", err)
}
