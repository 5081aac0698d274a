package janitor

import (
	"context"
	"fmt"
	"time"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
)

// This file holds marks back until the standby that holds the slot
// (CDCRELAY_REPLICATION_URL) has replayed them.
//
// The janitor marks rows on the primary; the slot is on the standby. If
// the slot passed a row whose mark the standby has not replayed yet, a
// promotion of that standby would lose the mark while keeping the slot's
// position: the row would stay unmarked behind the slot for good (alerts
// on the backlog, never retained, published again by any later adoption).
// So a flush calls its entries' done only once the standby has replayed
// the primary's position past the marks' commit; once it is no longer a
// standby (promoted) and had not replayed that far, the rows themselves
// are asked about.

// replicaPoll is how often a flush asks the standby again.
const replicaPoll = 5 * time.Millisecond

// replicaLostAfter is how long a flush waits for marks on a server that is
// no longer a standby: one promoted before it replayed them never will, so
// the entries are written again (now to it, through the primary's URL).
const replicaLostAfter = 2 * time.Second

// replayedSQL asks the standby whether it is still one and whether it has
// replayed $1 (the primary's position past the marks' commit): cheap, so
// it is the question asked every replicaPoll. pg_last_wal_replay_lsn()
// keeps the last position replayed in recovery after a promotion.
const replayedSQL = `SELECT pg_is_in_recovery(), coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`

// awaitReplica returns once the slot's server has the marks written up to
// lsn on the primary: a standby that replayed lsn has them; a server that
// is no longer a standby (promoted) is asked about the rows of ids
// themselves, since it may have been promoted before replaying them.
// Without CDCRELAY_REPLICATION_URL it does nothing.
func (j *Janitor) awaitReplica(ctx context.Context, lsn string, ids []string) error {
	if j.opts.SlotDatabaseURL == "" || len(ids) == 0 {
		return nil
	}
	if err := j.connectReplica(ctx); err != nil {
		return err
	}
	began, warned := time.Now(), false
	defer j.awaitingStandby(began, nil)
	for {
		done, err := j.replicaHas(ctx, lsn, ids)
		if err != nil {
			j.closeReplica()
			return err
		}
		if done {
			return nil
		}
		waited := time.Since(began)
		switch {
		case j.promoted && waited > replicaLostAfter:
			return fmt.Errorf("the slot's server is no longer a standby and lacks the marks of some of %d rows (promoted before replaying them): writing them again", len(ids))
		case !warned && waited > standbyWarn:
			warned = true
			j.log.Warn("marks wait for the standby that holds the slot to replay them (CDCRELAY_REPLICATION_URL); the slot does not pass their rows meanwhile", "lsn", lsn)
			j.awaitingStandby(began, &WaitError{What: "the standby that holds the slot (CDCRELAY_REPLICATION_URL) has not replayed the marks up to " + lsn + " yet"})
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(replicaPoll):
		}
	}
}

// replicaHas asks the slot's server once whether it has the marks.
func (j *Janitor) replicaHas(ctx context.Context, lsn string, ids []string) (bool, error) {
	var recovering, replayed bool
	if err := j.replica.QueryRow(ctx, replayedSQL, lsn).Scan(&recovering, &replayed); err != nil {
		return false, fmt.Errorf("ask the slot's server whether it replayed the marks: %w", err)
	}
	j.promoted = !recovering
	if replayed || recovering {
		return replayed, nil
	}
	var unmarked int
	if err := j.replica.QueryRow(ctx, j.replicaSQL, ids).Scan(&unmarked); err != nil {
		j.forgetStale(err)
		return false, fmt.Errorf("ask the slot's server whether it has the marks: %w", err)
	}
	return unmarked == 0, nil
}

// connectReplica opens the connection to the slot's server if there is
// none, and builds the question for the id column's type.
func (j *Janitor) connectReplica(ctx context.Context) error {
	if j.replica != nil && !j.replica.IsClosed() {
		return nil
	}
	j.replica = nil
	db, err := pgconnect.Connect(ctx, j.opts.SlotDatabaseURL, "to the slot's server for marks", pgconnect.Options{})
	if err != nil {
		return err
	}
	j.replica = db
	return nil
}

// replicaQuestion counts the rows of ids not marked on the slot's server.
// Built by statements with the id column's type.
func replicaQuestion(table, id, typ string) string {
	return fmt.Sprintf(`SELECT count(*) FROM %s WHERE %s = ANY($1::%s[]) AND published_at IS NULL`, table, id, typ)
}

func (j *Janitor) closeReplica() {
	if j.replica != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = j.replica.Close(ctx)
		j.replica = nil
	}
}
