-- cdcrelay:no-transaction
-- The HOT layout: marks the walsender decodes and the primary writes
-- cheaply. PostgreSQL makes an UPDATE a heap-only tuple (HOT: no index
-- entry written, the new version on the same page) only when no index
-- names a column it changes, in its key or its predicate, and when the
-- page has room. The default layout's partial indexes both name
-- published_at, so every mark is a full update. This file replaces them
-- with an index on enqueued_at for every row (retention walks it, and the
-- monitor's bounded backlog scan), an index on parked rows (the monitor
-- counts them), and leaves half of each new page free for the marks.
--
-- What it costs: no index finds the unpublished rows any more. The relay
-- never needs one while streaming; a slot's adoption (first start, a lost
-- slot) reads the table once in full, and the monitor bounds its scan by
-- enqueued_at (docs/operations.md, "The HOT layout"). Rows must take
-- enqueued_at from DEFAULT now().
--
-- Each statement runs on its own, outside a transaction block; none
-- blocks the services' inserts. fillfactor applies to pages written from
-- now on. Run `cdcrelay migrate -hot-marks`, or each statement in order
-- in your migration tool with the table's schema first on the search_path
-- (the indexes are named unqualified). For a plain table only. Any other
-- index that names published_at keeps marks from being heap-only.
ALTER TABLE event_outbox SET (fillfactor = 50);
CREATE INDEX CONCURRENTLY IF NOT EXISTS event_outbox_enqueued_idx ON event_outbox (enqueued_at);
CREATE INDEX CONCURRENTLY IF NOT EXISTS event_outbox_parked_idx ON event_outbox (enqueued_at) WHERE last_error IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS event_outbox_unpublished_idx;
DROP INDEX CONCURRENTLY IF EXISTS event_outbox_published_idx;
