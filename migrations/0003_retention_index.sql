-- cdcrelay:no-transaction
-- cdcrelay:unless-index 'event_outbox_enqueued_idx'
-- Retention deletes published rows older than CDCRELAY_RETENTION. Rows are
-- appended in about enqueued_at order, so the expired ones are the head of
-- this index: each retention batch reads only the rows it deletes, however
-- large the table. Without it retention still works, reading the whole
-- table once per run. Unpublished rows stay out of it, so inserts do not
-- touch it.
--
-- CONCURRENTLY: built without blocking the services' inserts into a live
-- outbox. It cannot run inside a transaction block: a migration tool must
-- run this file on its own, outside a transaction (cdcrelay migrate does).
-- A concurrent build that fails leaves an invalid index behind; drop it
-- (DROP INDEX CONCURRENTLY) before running this again (cdcrelay migrate
-- does that itself). On the HOT layout (optional/hot_marks.sql) the index
-- on every row's enqueued_at serves retention instead, and this file is
-- skipped: its index would make every mark a full update again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS event_outbox_published_idx
    ON event_outbox (enqueued_at) WHERE published_at IS NOT NULL;
