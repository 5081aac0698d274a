package inbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// EffectHandler applies one event's effects outside the ledger's database.
// ctx is cancelled (cause ErrLeaseLost) if another consumer takes the claim
// over while it runs.
type EffectHandler func(ctx context.Context, ev Event) error

// settleTimeout bounds the UPDATE that marks a claim done or releases it,
// which runs even when the caller's context has ended: an effect that
// happened should be recorded.
const settleTimeout = 10 * time.Second

// HandleEffect processes a delivery with a handler whose effects are
// outside the database, under a lease-based claim: see the package
// documentation. While another consumer holds a live claim on the message
// it waits, until that claim is done (a duplicate, acked) or its lease has
// expired (taken over).
func (ib *Inbox) HandleEffect(ctx context.Context, d amqp.Delivery, handler string, fn EffectHandler) (Result, error) {
	if err := check(d, handler); err != nil {
		return ib.reject(d, handler, err)
	}
	owner, err := newOwner()
	if err != nil {
		return ib.requeue(d, handler, err)
	}
	var c claimResult
	for {
		c, err = ib.claim(ctx, &d, handler, owner)
		if err != nil {
			return ib.requeue(d, handler, err)
		}
		if c.act == actDuplicate {
			return ib.duplicate(d, handler)
		}
		if c.act != actWait {
			break
		}
		t := time.NewTimer(c.wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ib.requeue(d, handler, fmt.Errorf("inbox: waiting for another consumer's claim on %s: %w", d.MessageId, ctx.Err()))
		case <-t.C:
		}
	}
	if c.act == actTakeOver {
		ib.metrics.takenOver.WithLabelValues(handler).Inc()
		ib.log.Info("inbox: took over a claim whose lease expired", "message_id", d.MessageId, "handler", handler, "attempt", c.ev.Attempt)
	}
	hctx, cancel := context.WithCancelCause(ctx)
	stop := ib.renew(hctx, cancel, d.MessageId, handler, owner)
	herr := fn(hctx, c.ev)
	stop()
	lost := errors.Is(context.Cause(hctx), ErrLeaseLost)
	cancel(nil)
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer scancel()
	if lost {
		return ib.leaseLost(d, handler)
	}
	if herr != nil {
		// Release so that the next delivery retries at once. A failed
		// release leaves the lease to expire instead.
		if _, err := ib.update(sctx, `UPDATE cdcrelay_inbox SET owner = NULL, lease_until = NULL
			WHERE message_id = $1 AND handler = $2 AND state = 'claimed' AND owner = $3`, d.MessageId, handler, owner); err != nil {
			ib.log.Warn("inbox: release a failed claim", "message_id", d.MessageId, "handler", handler, "error", err.Error())
		}
		return ib.handlerFailed(ctx, d, handler, herr)
	}
	// Conditioned on the owner token: a stale owner whose claim was taken
	// over changes nothing.
	n, err := ib.update(sctx, `UPDATE cdcrelay_inbox SET state = 'done', done_at = now(), owner = NULL, lease_until = NULL
		WHERE message_id = $1 AND handler = $2 AND state = 'claimed' AND owner = $3`, d.MessageId, handler, owner)
	if err != nil {
		// The effect happened but is not recorded: the redelivery retries
		// it after the lease.
		return ib.requeue(d, handler, fmt.Errorf("inbox: mark %s done for %s: %w", d.MessageId, handler, err))
	}
	if n == 0 {
		return ib.leaseLost(d, handler)
	}
	return ib.handled(d, handler, c.ev.Order)
}

// leaseLost settles a delivery whose claim another consumer took over
// while the handler ran: that consumer holds its own copy of the message
// and settles it, so this copy is acked, whatever the handler returned.
func (ib *Inbox) leaseLost(d amqp.Delivery, handler string) (Result, error) {
	ib.metrics.errors.WithLabelValues(handler).Inc()
	ib.log.Warn("inbox: the claim was taken over while the handler ran; its effects may have happened twice",
		"message_id", d.MessageId, "handler", handler)
	if err := d.Ack(false); err != nil {
		return Handled, fmt.Errorf("%w: %s for %s (ack: %w)", ErrLeaseLost, d.MessageId, handler, err)
	}
	return Handled, fmt.Errorf("%w: %s for %s", ErrLeaseLost, d.MessageId, handler)
}

// claimResult is what one look at the ledger decided.
type claimResult struct {
	act  action
	wait time.Duration // for actWait
	ev   Event
}

// claim takes the claim for owner in one short transaction, following
// decide on the row it locked, at the database's clock.
func (ib *Inbox) claim(ctx context.Context, d *amqp.Delivery, handler, owner string) (claimResult, error) {
	pos := PositionOf(d.Headers)
	c := claimResult{ev: Event{Delivery: d, MessageID: d.MessageId, Handler: handler, Position: pos}}
	leaseMicros := ib.lease.Microseconds()
	err := pgx.BeginFunc(ctx, ib.db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `INSERT INTO cdcrelay_inbox
			(message_id, handler, state, owner, lease_until, routing_key, commit_lsn, tx_index)
			VALUES ($1, $2, 'claimed', $3, clock_timestamp() + $4 * interval '1 microsecond', $5, $6::pg_lsn, $7)
			ON CONFLICT (message_id, handler) DO NOTHING RETURNING attempts`,
			d.MessageId, handler, owner, leaseMicros, d.RoutingKey, lsnArg(pos), indexArg(pos)).Scan(&c.ev.Attempt)
		switch {
		case err == nil:
			c.act = actClaim
		case errors.Is(err, pgx.ErrNoRows):
			if err := ib.reclaim(ctx, tx, d.MessageId, handler, owner, &c); err != nil {
				return err
			}
			if c.act == actWait || c.act == actDuplicate {
				return nil
			}
		default:
			return err
		}
		c.ev.Order, err = advanceOrder(ctx, tx, handler, d, pos)
		return err
	})
	if err != nil {
		return c, fmt.Errorf("inbox: claim %s for %s: %w", d.MessageId, handler, err)
	}
	return c, nil
}

// reclaim decides on an existing row, locked, and takes it if decide says
// so, with an UPDATE conditioned on the owner it read.
func (ib *Inbox) reclaim(ctx context.Context, tx pgx.Tx, messageID, handler, owner string, c *claimResult) error {
	var (
		state    string
		oldOwner *string
		lease    *time.Time
		now      time.Time
		row      = ledgerRow{exists: true}
	)
	if err := tx.QueryRow(ctx, `SELECT state, owner, lease_until, attempts, clock_timestamp() FROM cdcrelay_inbox
		WHERE message_id = $1 AND handler = $2 FOR UPDATE`, messageID, handler).Scan(&state, &oldOwner, &lease, &row.attempts, &now); err != nil {
		return err
	}
	row.done = state == "done"
	if oldOwner != nil {
		row.owner = *oldOwner
	}
	if lease != nil {
		row.leaseUntil = *lease
	}
	c.act = decide(row, now)
	switch c.act {
	case actWait:
		c.wait = max(min(ib.poll, row.leaseUntil.Sub(now)), time.Millisecond)
		return nil
	case actDuplicate:
		return nil
	}
	return tx.QueryRow(ctx, `UPDATE cdcrelay_inbox
		SET owner = $3, lease_until = clock_timestamp() + $4 * interval '1 microsecond', attempts = attempts + 1
		WHERE message_id = $1 AND handler = $2 AND state = 'claimed' AND owner IS NOT DISTINCT FROM $5
		RETURNING attempts`, messageID, handler, owner, ib.lease.Microseconds(), oldOwner).Scan(&c.ev.Attempt)
}

// renew extends the lease every third of it while the handler runs. When
// the claim is no longer owner's (taken over), it cancels the handler's
// context with ErrLeaseLost. The returned stop waits for the renewer to
// end, so no renewal runs after the claim is settled.
func (ib *Inbox) renew(ctx context.Context, cancel context.CancelCauseFunc, messageID, handler, owner string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(ib.lease / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			n, err := ib.update(ctx, `UPDATE cdcrelay_inbox SET lease_until = clock_timestamp() + $4 * interval '1 microsecond'
				WHERE message_id = $1 AND handler = $2 AND state = 'claimed' AND owner = $3`,
				messageID, handler, owner, ib.lease.Microseconds())
			switch {
			case err != nil && ctx.Err() == nil:
				// Try again on the next tick; the lease may still hold.
				ib.log.Warn("inbox: renew a claim's lease", "message_id", messageID, "handler", handler, "error", err.Error())
			case err == nil && n == 0:
				cancel(ErrLeaseLost)
				return
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// update runs one statement in its own transaction and returns the rows
// it changed.
func (ib *Inbox) update(ctx context.Context, sql string, args ...any) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, ib.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sql, args...)
		n = tag.RowsAffected()
		return err
	})
	return n, err
}

// newOwner is a random owner token, one per HandleEffect call.
func newOwner() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("inbox: owner token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}
