package janitor

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/pgconnect"
	"github.com/cdcrelay/cdcrelay/internal/pgerr"
)

// This file holds marks back until the standby that holds the slot
// (CDCRELAY_REPLICATION_URL) has replayed them.
//
// The janitor marks rows on the primary; the slot is on the standby. If
// the slot passed a row whose mark the standby has not replayed yet, a
// promotion of that standby would lose the mark while keeping the slot's
// position: the row would stay unmarked behind the slot for good (alerts
// on the backlog, never retained, published again by any later adoption).
// So a flush calls its entries' done only once the standby shows the rows
// marked. Asking about the rows themselves, rather than comparing WAL
// positions, gives the same answer on a standby, on a standby promoted
// since, and on a primary.

// replicaPoll is how often a flush asks the standby again.
const replicaPoll = 5 * time.Millisecond

// replicaLostAfter is how long a flush waits for marks on a server that is
// no longer a standby: one promoted before it replayed them never will, so
// the entries are written again (now to it, through the primary's URL).
const replicaLostAfter = 2 * time.Second

// awaitReplica returns once the slot's server shows every row of ids
// marked (or gone). Without CDCRELAY_REPLICATION_URL it does nothing.
func (j *Janitor) awaitReplica(ctx context.Context, ids []string) error {
	if j.opts.SlotDatabaseURL == "" || len(ids) == 0 {
		return nil
	}
	if err := j.connectReplica(ctx); err != nil {
		return err
	}
	began, warned := time.Now(), false
	for {
		var unmarked int
		var recovering bool
		if err := j.replica.QueryRow(ctx, j.replicaSQL, ids).Scan(&unmarked, &recovering); err != nil {
			j.forgetStale(err)
			j.closeReplica()
			return fmt.Errorf("ask the slot's server whether it has the marks: %w", err)
		}
		waited := time.Since(began)
		switch {
		case unmarked == 0:
			return nil
		case !recovering && waited > replicaLostAfter:
			return fmt.Errorf("the slot's server is no longer a standby and lacks the marks of %d rows (promoted before replaying them): writing them again", unmarked)
		case !warned && waited > standbyWarn:
			warned = true
			j.log.Warn("marks wait for the standby that holds the slot to replay them (CDCRELAY_REPLICATION_URL); the slot does not pass their rows meanwhile", "rows", unmarked)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(replicaPoll):
		}
	}
}

// connectReplica opens the connection to the slot's server if there is
// none, and builds the question for the id column's type.
func (j *Janitor) connectReplica(ctx context.Context) error {
	if j.replica != nil && !j.replica.IsClosed() {
		return nil
	}
	j.replica = nil
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cfg, err := pgconnect.Config(j.opts.SlotDatabaseURL, nil)
	if err != nil {
		return err
	}
	db, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to the slot's server: %w", pgerr.Connect(err))
	}
	j.replica = db
	return nil
}

// replicaQuestion counts the rows of ids not marked on the slot's server,
// and says whether it is still a standby. Built by statements with the id
// column's type.
func replicaQuestion(table, id, typ string) string {
	return fmt.Sprintf(`SELECT (SELECT count(*) FROM %s WHERE %s = ANY($1::%s[]) AND published_at IS NULL), pg_is_in_recovery()`, table, id, typ)
}

func (j *Janitor) closeReplica() {
	if j.replica != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = j.replica.Close(ctx)
		j.replica = nil
	}
}
