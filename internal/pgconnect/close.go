package pgconnect

import (
	"context"
	"time"
)

// CloseWait bounds a connection's close: it runs on the stop path, once
// the caller's context may have ended, and a server that stopped
// answering must not hold the exit (pgx closes the socket when the
// deadline passes).
const CloseWait = 2 * time.Second

// Close closes conn (a *pgx.Conn or a *pgconn.PgConn) within CloseWait,
// whether or not ctx has ended.
func Close(ctx context.Context, conn interface{ Close(context.Context) error }) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CloseWait)
	defer cancel()
	_ = conn.Close(cctx)
}
