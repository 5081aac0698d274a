-- The inbox ledger of package github.com/cdcrelay/cdcrelay/inbox, in the
-- consumer's database (not the relay's outbox database). Idempotent: every
-- statement may run again. Migrate applies it under an advisory lock.

-- One row per (message_id, handler): written as 'done' in the handler's own
-- transaction by Handle; 'claimed' with an owner token and a lease, then
-- 'done', by HandleEffect. The primary key is the claim's index.
CREATE TABLE IF NOT EXISTS cdcrelay_inbox (
    message_id  TEXT        NOT NULL,
    handler     TEXT        NOT NULL,
    state       TEXT        NOT NULL CHECK (state IN ('claimed', 'done')),
    owner       TEXT,
    lease_until TIMESTAMPTZ,
    attempts    INT         NOT NULL DEFAULT 1,
    routing_key TEXT        NOT NULL DEFAULT '',
    commit_lsn  PG_LSN,
    tx_index    BIGINT,
    claimed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    done_at     TIMESTAMPTZ,
    PRIMARY KEY (message_id, handler),
    CHECK ((state = 'done') = (done_at IS NOT NULL))
);

-- Retention (Purge) deletes done rows by age.
CREATE INDEX IF NOT EXISTS cdcrelay_inbox_done_idx ON cdcrelay_inbox (done_at) WHERE state = 'done';

-- Claims still open, for an operator looking for stuck or crashed handlers.
CREATE INDEX IF NOT EXISTS cdcrelay_inbox_claimed_idx ON cdcrelay_inbox (lease_until) WHERE state = 'claimed';

-- The greatest (timeline, commit LSN, index) claimed per handler and
-- routing key, to tell a late first delivery from an event in order.
CREATE TABLE IF NOT EXISTS cdcrelay_inbox_order (
    handler     TEXT        NOT NULL,
    routing_key TEXT        NOT NULL,
    commit_lsn  PG_LSN      NOT NULL,
    tx_index    BIGINT      NOT NULL,
    message_id  TEXT        NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (handler, routing_key)
);

-- The pair's timeline (the cdcrelay-timeline header), NULL for a message
-- without one (a relay older than the header): a promoted standby reuses
-- LSNs, so the pair alone goes back across a failover. Added to ledgers
-- created before it; the check keeps a ledger that has it from taking the
-- table's exclusive lock, which would wait for every open claim.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'cdcrelay_inbox_order'::regclass
                   AND attname = 'timeline' AND NOT attisdropped) THEN
        ALTER TABLE cdcrelay_inbox_order ADD COLUMN timeline BIGINT;
    END IF;
END
$$;

-- Retention (Purge) deletes keys not seen for as long as done rows are kept.
CREATE INDEX IF NOT EXISTS cdcrelay_inbox_order_updated_idx ON cdcrelay_inbox_order (updated_at);
