package inbox

import (
	"context"
	"fmt"
	"time"
)

// purgeBatch bounds each retention DELETE, so no statement holds many row
// locks or runs long next to the consumers' claims.
const purgeBatch = 1000

// Purge deletes done ledger rows older than keep, and the ordering record
// of routing keys not seen for as long, in batches; it returns the ledger
// rows deleted. Open claims are never deleted. keep must exceed the longest time a copy of a message can arrive
// after its first: a copy arriving after its row is gone runs the handler
// again. Call it periodically (RunRetention does).
func (ib *Inbox) Purge(ctx context.Context, keep time.Duration) (int64, error) {
	if keep <= 0 {
		return 0, fmt.Errorf("inbox: retention must keep rows for a positive time, not %v", keep)
	}
	micros := keep.Microseconds()
	var total int64
	for {
		n, err := ib.update(ctx, `DELETE FROM cdcrelay_inbox WHERE ctid = ANY (ARRAY(
			SELECT ctid FROM cdcrelay_inbox WHERE state = 'done' AND done_at < now() - $1 * interval '1 microsecond'
			LIMIT $2 FOR UPDATE SKIP LOCKED))`, micros, purgeBatch)
		if err != nil {
			return total, fmt.Errorf("inbox: purge done rows: %w", err)
		}
		total += n
		ib.metrics.purged.Add(float64(n))
		if n < purgeBatch {
			break
		}
	}
	for {
		n, err := ib.update(ctx, `DELETE FROM cdcrelay_inbox_order WHERE ctid = ANY (ARRAY(
			SELECT ctid FROM cdcrelay_inbox_order WHERE updated_at < now() - $1 * interval '1 microsecond'
			LIMIT $2 FOR UPDATE SKIP LOCKED))`, micros, purgeBatch)
		if err != nil {
			return total, fmt.Errorf("inbox: purge ordering records: %w", err)
		}
		if n < purgeBatch {
			return total, nil
		}
	}
}

// RunRetention calls Purge every interval until ctx ends, logging each
// failure (the next round tries again). It returns ctx's error.
func (ib *Inbox) RunRetention(ctx context.Context, interval, keep time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("inbox: retention interval must be positive, not %v", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if n, err := ib.Purge(ctx, keep); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			ib.log.Warn("inbox: retention", "error", err.Error())
		} else if n > 0 {
			ib.log.Info("inbox: retention deleted done ledger rows", "rows", n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
