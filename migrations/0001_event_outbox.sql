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

CREATE INDEX IF NOT EXISTS event_outbox_unpublished_idx
    ON event_outbox (enqueued_at) WHERE published_at IS NULL;
