package main

// The backlog of large payloads: peak RSS while the relay drains events
// of 512 KiB, which its in-flight byte budget (CDCRELAY_MAX_IN_FLIGHT_BYTES)
// bounds rather than its event count.

import (
	"context"
	"fmt"

	"github.com/cdcrelay/cdcrelay/internal/toolkit"
)

const (
	// bigPayloadBytes is the size of each large event's payload.
	bigPayloadBytes = 512 << 10
	// bigPayloadChunk is the transaction size of the large backlog (8 MiB each).
	bigPayloadChunk = 16
)

// insertBigSQL inserts events $2..$3 with a payload of $4 bytes in all:
// the usual envelope (id, event_type, trace_context) and a data string
// padding it to size.
const insertBigSQL = `INSERT INTO event_outbox (routing_key, payload)
	SELECT $1, jsonb_build_object(
		'id', md5('big' || g)::uuid,
		'event_type', 'OrderCreated',
		'trace_context', '00-' || md5('trace' || g) || '-' || left(md5('span' || g), 16) || '-01',
		'data', repeat('x', $4::int - 200))
	FROM generate_series($2::int, $3::int) g
	RETURNING id::text`

// insertBig commits n events of about size bytes each in transactions of
// bigPayloadChunk and returns their ids.
func (in *inserter) insertBig(ctx context.Context, n, size int) (map[string]struct{}, error) {
	want := make(map[string]struct{}, n)
	for done := 0; done < n; {
		k := min(bigPayloadChunk, n-done)
		first := in.next
		in.next += k
		rows, err := in.db.Query(ctx, insertBigSQL, routingKey, first, first+k-1, size)
		if err != nil {
			return nil, fmt.Errorf("insert %d large events: %w", k, err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, fmt.Errorf("insert %d large events: %w", k, err)
			}
			want[id] = struct{}{}
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("insert %d large events: %w", k, err)
		}
		done += k
	}
	return want, nil
}

// bigPayloads: with the relay stopped, commit opts.bigPayloads events of
// bigPayloadBytes, start a fresh relay (so its peak RSS is this phase's
// alone), drain them as drainBacklog does, read the peak RSS and stop it.
func (b *bench) bigPayloads(ctx context.Context) error {
	n, r := b.opts.bigPayloads, b.res
	say("inserting a backlog of %s events of %d KiB (transactions of %d) with the relay stopped", toolkit.Thousands(n), bigPayloadBytes>>10, bigPayloadChunk)
	want, err := b.ins.insertBig(ctx, n, bigPayloadBytes)
	if err != nil {
		return err
	}
	rp, _, err := b.timeDrain(ctx, fmt.Sprintf("drain of %d KiB payloads", bigPayloadBytes>>10), b.relayVars, want, &r.bigPayload)
	if err != nil {
		return err
	}
	if r.rssBigPayload, err = peakRSS(rp.Pid()); err != nil {
		return err
	}
	say("  %s ev/s, %.0f MiB/s, peak RSS %s", toolkit.Thousands(int(r.bigPayload.rate())),
		r.bigPayload.rate()*bigPayloadBytes/(1<<20), mib(r.rssBigPayload))
	say("stopping the relay")
	return b.stopRelay(ctx, rp)
}
