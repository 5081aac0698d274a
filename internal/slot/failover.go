package slot

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrFailoverUnsupported means CDCRELAY_SLOT_FAILOVER=on asks for what the
// server cannot do (pgcaps.Caps.CanFailover): no retry changes the
// server's version or role.
var ErrFailoverUnsupported = errors.New("the server cannot keep a failover slot")

// ErrSlotServer means CDCRELAY_REPLICATION_URL names a server that cannot
// hold the slot for this primary (another system, a standby before 16,
// one without wal_level=logical or hot_standby_feedback).
var ErrSlotServer = errors.New("the replication server cannot hold the slot")

// alterWait bounds ALTER_REPLICATION_SLOT: it waits while another process
// streams the slot, which the caller checked it does not.
const alterWait = 10 * time.Second

// SetFailover turns failover on or off for an existing, inactive slot with
// ALTER_REPLICATION_SLOT on the replication connection. The slot keeps its
// position: nothing is adopted again. If the command does not answer within
// alterWait it is cancelled on the server, and the error says why.
func SetFailover(ctx context.Context, repl *pgconn.PgConn, name string, on bool) error {
	cmd := fmt.Sprintf("ALTER_REPLICATION_SLOT %s (FAILOVER %t)", pgx.Identifier{name}.Sanitize(), on)
	actx, cancel := context.WithTimeout(ctx, alterWait)
	defer cancel()
	// A cancel request, not a closed socket, ends a blocked command and
	// leaves the connection usable for streaming; a server that does not
	// answer it within 5 s loses the connection.
	ectx, ecancel := context.WithCancel(context.WithoutCancel(ctx))
	defer ecancel()
	stop := context.AfterFunc(actx, func() {
		rctx, rcancel := context.WithTimeout(ectx, 5*time.Second)
		defer rcancel()
		_ = repl.CancelRequest(rctx)
		time.AfterFunc(5*time.Second, ecancel)
	})
	_, err := repl.Exec(ectx, cmd).ReadAll()
	stop()
	if err != nil {
		if actx.Err() != nil && ctx.Err() == nil {
			return fmt.Errorf("%s: no answer within %s (another process streams the slot?): %w", cmd, alterWait, err)
		}
		return fmt.Errorf("%s: %w", cmd, err)
	}
	return nil
}

// System is what IDENTIFY_SYSTEM says of the server behind a replication
// connection.
type System struct {
	ID       string
	Timeline int32
}

// Identify runs IDENTIFY_SYSTEM on the replication connection.
func Identify(ctx context.Context, repl *pgconn.PgConn) (System, error) {
	res, err := pglogrepl.IdentifySystem(ctx, repl)
	if err != nil {
		return System{}, fmt.Errorf("identify system: %w", err)
	}
	return System{ID: res.SystemID, Timeline: res.Timeline}, nil
}

// StandbySlots splits synchronized_standby_slots as PostgreSQL does: a
// comma-separated list of names, folded to lower case unless quoted.
func StandbySlots(setting string) []string {
	var names []string
	for _, f := range strings.Split(setting, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "":
		case len(f) >= 2 && f[0] == '"' && f[len(f)-1] == '"':
			names = append(names, strings.ReplaceAll(f[1:len(f)-1], `""`, `"`))
		default:
			names = append(names, strings.ToLower(f))
		}
	}
	return names
}
