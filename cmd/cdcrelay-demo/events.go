package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

// multiRowEvery makes every n-th transaction carry several events, as a
// service that emits more than one event per change would.
const (
	multiRowEvery = 4
	multiRowSize  = 3
)

// orderEvent is the sample payload. SentAt is taken just before the INSERT
// so the consumer side can compute commit-to-delivery latency from the
// message alone.
type orderEvent struct {
	EventType string    `json:"event_type"`
	OrderID   int       `json:"order_id"`
	Customer  string    `json:"customer"`
	SentAt    time.Time `json:"sent_at"` // RFC 3339 with nanoseconds
}

func connectDB(ctx context.Context, dbURL string) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("connect to demo database: %w", err)
	}
	return conn, nil
}

// waitStreaming waits until the relay holds the replication slot, so the
// first inserts show streaming latency rather than start-up time.
func waitStreaming(ctx context.Context, db *pgx.Conn, relay *toolkit.Proc, slot string) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		var active bool
		err := db.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		switch {
		case err == nil && active:
			step("relay is streaming from slot %s", slot)
			return nil
		case err != nil && !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("wait for relay to stream: %w", err)
		}
		select {
		case <-relay.Exited():
			return fmt.Errorf("relay exited before streaming: %w", relay.Err())
		case <-ctx.Done():
			return fmt.Errorf("relay did not start streaming from slot %s within %v: %w", slot, readyTimeout, ctx.Err())
		case <-tick.C:
		}
	}
}

// insertEvents inserts opts.events events at opts.rate, mostly one per
// transaction and every multiRowEvery-th transaction several at once.
func insertEvents(ctx context.Context, db *pgx.Conn, opts options) error {
	var interval time.Duration
	if opts.rate > 0 {
		interval = time.Duration(float64(time.Second) / opts.rate)
	}
	next := time.Now()
	for tx, order := 1, 1; order <= opts.events; tx++ {
		n := 1
		if tx%multiRowEvery == 0 {
			n = min(multiRowSize, opts.events-order+1)
		}
		if err := insertTx(ctx, db, order, n); err != nil {
			return err
		}
		printInsert(tx, order, n)
		order += n
		next = next.Add(time.Duration(n) * interval)
		if err := sleepUntil(ctx, next); err != nil {
			return err
		}
	}
	return nil
}

// insertTx inserts orders first..first+n-1 in one transaction.
func insertTx(ctx context.Context, db *pgx.Conn, first, n int) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // no-op after Commit
	for order := first; order < first+n; order++ {
		payload, err := json.Marshal(orderEvent{
			EventType: "OrderCreated",
			OrderID:   order,
			Customer:  fmt.Sprintf("customer-%d", order%7),
			SentAt:    time.Now(),
		})
		if err != nil {
			return fmt.Errorf("encode order %d: %w", order, err)
		}
		_, err = tx.Exec(ctx, "INSERT INTO event_outbox (routing_key, payload) VALUES ($1, $2)", routingKey, payload)
		if err != nil {
			return fmt.Errorf("insert order %d: %w", order, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit orders %d..%d: %w", first, first+n-1, err)
	}
	return nil
}

func printInsert(tx, first, n int) {
	if n == 1 {
		fmt.Printf("insert| tx %d: order %d\n", tx, first)
		return
	}
	fmt.Printf("insert| tx %d: orders %d-%d in one transaction\n", tx, first, first+n-1)
}

func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// janitorGrace is how long the demo gives the relay's janitor to mark the
// delivered rows published before reporting where it got to.
const janitorGrace = 2 * time.Second

// printJanitorProgress shows how far the relay has marked rows published and
// moved the slot. Informational only: the janitor works in batches and the
// slot position is reported on the relay's status interval, so both may
// trail the deliveries.
func printJanitorProgress(ctx context.Context, db *pgx.Conn) {
	ctx, cancel := context.WithTimeout(ctx, janitorGrace)
	defer cancel()
	var published, total int
	var confirmed, current string
	for {
		err := db.QueryRow(ctx, `
			SELECT (SELECT count(*) FILTER (WHERE published_at IS NOT NULL) FROM event_outbox),
			       (SELECT count(*) FROM event_outbox),
			       coalesce((SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1), '-'),
			       pg_current_wal_lsn()::text`, demoSlot).Scan(&published, &total, &confirmed, &current)
		if err != nil && ctx.Err() == nil {
			step("could not read outbox progress: %v", err)
			return
		}
		if err != nil || published == total || sleepUntil(ctx, time.Now().Add(200*time.Millisecond)) != nil {
			break
		}
	}
	step("outbox rows marked published_at: %d/%d; slot confirmed_flush_lsn %s (server WAL at %s)", published, total, confirmed, current)
}
