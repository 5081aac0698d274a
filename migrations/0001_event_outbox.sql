-- The transactional outbox. Services insert one row per event in the same
-- transaction as the change it describes; cdcrelay streams the inserts.
CREATE TABLE IF NOT EXISTS event_outbox (
    id UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    routing_key TEXT NOT NULL,
    payload JSONB NOT NULL,
    enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    published_at TIMESTAMPTZ,
    attempts INT NOT NULL DEFAULT 0,
    last_error TEXT
);

-- The index is looked up first: CREATE INDEX takes its lock on the table
-- before IF NOT EXISTS is checked, and on a live outbox that lock would
-- queue every insert behind the longest open transaction, on every run.
DO $$
BEGIN
    -- A table on the HOT layout (optional/hot_marks.sql, which creates
    -- event_outbox_enqueued_idx) keeps no index naming published_at.
    IF NOT EXISTS (SELECT 1 FROM pg_class
                   WHERE relname IN ('event_outbox_unpublished_idx', 'event_outbox_enqueued_idx')
                     AND relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'event_outbox'::regclass)) THEN
        CREATE INDEX event_outbox_unpublished_idx
            ON event_outbox (enqueued_at) WHERE published_at IS NULL;
    END IF;
END
$$;
