package publish

import (
	"context"
	"errors"
	"time"
)

// stuckGrace is how long a pipeline whose context ended with a failure may
// take to return on its own before its link's socket is closed under it.
const stuckGrace = time.Second

// abortIfStuck arms the sink's abort for when ctx (an errgroup's context)
// ends with a failure as its cause and the returned disarm is not called
// within stuckGrace. A publish blocked in a socket write, because the
// broker stopped reading (a memory alarm with more unconfirmed bytes than
// the socket buffers hold), ignores contexts and holds amqp091-go's locks,
// so the group would wait for it until the broker reads again; closing
// the socket fails the write (invariant 5, docs/architecture.md).
//
// A context that ended without a failure (context.Canceled: the group
// finished cleanly, or its caller stopped it) arms nothing: the link may
// still be used, and a caller that stops a pipeline owns the deadline for
// it. A failed pipeline's link is never used again, so aborting it is
// always safe; the grace only spares a failure that unwinds by itself an
// unclean end of the connection.
func abortIfStuck(ctx context.Context, abort func()) (disarm func()) {
	disarmed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		if errors.Is(context.Cause(ctx), context.Canceled) {
			return
		}
		t := time.NewTimer(stuckGrace)
		defer t.Stop()
		select {
		case <-t.C:
			abort()
		case <-disarmed:
		}
	})
	return func() {
		stop()
		close(disarmed)
	}
}
