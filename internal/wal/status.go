package wal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/cdcrelay/cdcrelay/internal/failpoint"
)

// This file is the reader's side of the standby status updates: when they
// go out, what they carry, the final one of a graceful stop, and the one
// after a session that the broker side ended.

// maybeSendStatus reports the position when the server asked, when the
// interval has passed, or when the position moved and progressDelay passed.
func (r *Reader) maybeSendStatus(force bool) error {
	if r.cfg.Turned != nil {
		r.cfg.Turned()
	}
	pos := r.cfg.Positions.Position()
	since := time.Since(r.lastSent)
	if !force && since < r.cfg.StatusInterval && (pos <= r.sent || since < progressDelay) {
		return nil
	}
	return r.sendStatus(pos)
}

// sendStatus reports pos as written, flushed and applied. All three are set
// explicitly (pglogrepl would copy write into a zero flush) and the value
// never goes below what was sent before.
func (r *Reader) sendStatus(pos pglogrepl.LSN) error {
	pos = max(pos, r.sent)
	if pos > r.sent {
		failpoint.Hit(failpoint.BeforeStatus)
	}
	err := r.conn.SendStatus(context.Background(), pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pos,
		WALFlushPosition: pos,
		WALApplyPosition: pos,
		ClientTime:       time.Now(),
		// A silent server is asked to answer at once, so that Timeout only
		// fires on a dead connection.
		ReplyRequested: r.cfg.Timeout > 0 && time.Since(r.lastRecv) >= r.cfg.StatusInterval,
	})
	if err != nil {
		return fmt.Errorf("send standby status update: %w", err)
	}
	if pos > r.sent {
		r.cfg.Log.Debug("confirmed position", "lsn", pos)
	}
	r.sent, r.lastSent = pos, time.Now()
	r.cfg.Metrics.confirmed.Set(float64(pos))
	r.cfg.Metrics.statuses.Inc()
	return nil
}

// drain runs after SoftStop: no more reading; status updates continue until the
// publisher has drained (or ctx ends), then a final one is sent.
func (r *Reader) drain(ctx context.Context) error {
	tick := time.NewTicker(progressDelay)
	defer tick.Stop()
	r.closeOut() // the publisher finishes what it has; Settled closes once their rows are marked too
	for {
		select {
		case <-r.cfg.Settled:
			return r.sendStatus(r.cfg.Positions.Position())
		case <-ctx.Done():
			if err := r.sendStatus(r.cfg.Positions.Position()); err != nil {
				r.cfg.Log.Warn("final status update failed", "error", err)
			}
			return ctx.Err()
		case <-tick.C:
			if err := r.maybeSendStatus(false); err != nil {
				return err
			}
		}
	}
}

// ReportPosition reports the current position to the server once more, after Run has returned
// (the caller owns the connection again): a session that the broker side
// ended leaves a healthy replication connection, and the marks written
// while it wound down may have moved the position since the last update.
// It sends nothing when the position has not moved.
func (r *Reader) ReportPosition() error {
	pos := r.cfg.Positions.Position()
	if pos <= r.sent {
		return nil
	}
	// A connection that failed is closed by its driver, which writes its
	// goodbye from a goroutine of its own; the slot keeps what was sent.
	if r.conn.broken() {
		return errors.New("the replication connection is closed")
	}
	return r.sendStatus(pos)
}

// Sent is the last position reported to the server.
func (r *Reader) Sent() pglogrepl.LSN { return r.sent }
