-- Retention deletes published rows older than CDCRELAY_RETENTION. Rows are
-- appended in about enqueued_at order, so the expired ones are the head of
-- this index: each retention batch reads only the rows it deletes, however
-- large the table. Without it retention still works, reading the whole
-- table once per run. Unpublished rows stay out of it, so inserts do not
-- touch it.
--
-- On a large table that is already live, create it first without blocking
-- writes (this file then changes nothing):
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS event_outbox_published_idx
--       ON event_outbox (enqueued_at) WHERE published_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS event_outbox_published_idx
    ON event_outbox (enqueued_at) WHERE published_at IS NOT NULL;
