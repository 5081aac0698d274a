package faults_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcrelay/cdcrelay/internal/testenv/relaytest"
)

// routingKeys are rotated per transaction so the order check runs per key.
var routingKeys = []string{"ev.k0", "ev.k1", "ev.k2", "ev.k3"}

// insertTx inserts one transaction of n rows and returns their ids; the
// payload's n runs 1..n so the checks can match each row's index in its
// transaction.
func insertTx(ctx context.Context, db *pgx.Conn, key string, n int) ([]string, error) {
	var ids []string
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := relaytest.Insert(ctx, tx, key, n)
		ids = relaytest.IDs(rows)
		return err
	})
	return ids, err
}

// insert commits txs transactions of size rows each, rotating the routing
// keys, and returns the ids in commit order.
func (w *world) insert(t *testing.T, txs, size int) []string {
	t.Helper()
	return ids(w.insertCommits(t, txs, size))
}

// insertCommits is insert with the commit time of each transaction.
func (w *world) insertCommits(t *testing.T, txs, size int) []commit {
	t.Helper()
	var out []commit
	for i := range txs {
		ids, err := insertTx(context.Background(), w.db, routingKeys[i%len(routingKeys)], size)
		if err != nil {
			t.Fatalf("insert: %v", err)
		}
		out = append(out, commit{at: time.Now(), ids: ids})
	}
	return out
}

// ids flattens the ids of transactions.
func ids(cs []commit) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.ids...)
	}
	return out
}

// commit is one transaction the loader saw commit.
type commit struct {
	at  time.Time
	ids []string
}

// loader inserts events at a steady rate from its own connection and keeps
// going through database failures (reconnecting). A transaction whose
// COMMIT outcome is unknown (the connection died) is not recorded; the
// checks take the truth from the table, so such rows still count.
type loader struct {
	mu      sync.Mutex
	commits []commit
	events  int
	errs    []string
	done    chan struct{}
	cancel  context.CancelFunc
}

// record adds one committed transaction's ids.
func (l *loader) record(ids []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.commits = append(l.commits, commit{at: time.Now(), ids: ids})
	l.events += len(ids)
}

// load inserts total events in transactions of txSize at about rate events
// per second.
func (w *world) load(total, rate, txSize int) *loader {
	ctx, cancel := context.WithCancel(context.Background())
	l := &loader{done: make(chan struct{}), cancel: cancel}
	w.t.Cleanup(func() { cancel(); <-l.done })
	go func() {
		defer close(l.done)
		var db *pgx.Conn
		defer func() {
			if db != nil {
				_ = db.Close(context.Background())
			}
		}()
		interval := time.Duration(float64(time.Second) * float64(txSize) / float64(rate))
		next := time.Now()
		for i := 0; l.count() < total; i++ {
			if ctx.Err() != nil {
				return
			}
			if db == nil {
				cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
				c, err := pgx.Connect(cctx, w.dbURL)
				ccancel()
				if err != nil {
					l.fail(err)
					sleepCtx(ctx, 100*time.Millisecond)
					continue
				}
				db = c
			}
			n := min(txSize, total-l.count())
			ids, err := insertTx(ctx, db, routingKeys[i%len(routingKeys)], n)
			if err != nil {
				l.fail(err)
				_ = db.Close(context.Background())
				db = nil
				sleepCtx(ctx, 100*time.Millisecond)
				continue
			}
			l.record(ids)
			next = next.Add(interval)
			if d := time.Until(next); d > 0 {
				sleepCtx(ctx, d)
			} else if d < -time.Second {
				next = time.Now() // fell behind (an outage): do not burst
			}
		}
	}()
	return l
}

func (l *loader) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.events
}

func (l *loader) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err.Error())
}

// wait waits until the loader has committed everything.
func (l *loader) wait(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(within):
		t.Fatalf("loader: %d events committed after %s", l.count(), within)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) > 0 {
		t.Logf("loader: %d failed attempts (retried), first: %s", len(l.errs), l.errs[0])
	}
}

// since returns the transactions committed at or after t0.
func (l *loader) since(t0 time.Time) []commit {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []commit
	for _, c := range l.commits {
		if !c.at.Before(t0) {
			out = append(out, c)
		}
	}
	return out
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
