-- The publication cdcrelay streams: inserts into the outbox only. It must
-- exist before the replication slot. Run as the table's owner. A
-- partitioned outbox is published through its root, so that every
-- partition's rows arrive as the table's own.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'cdcrelay_outbox') THEN
        IF (SELECT relkind FROM pg_class WHERE oid = 'event_outbox'::regclass) = 'p' THEN
            CREATE PUBLICATION cdcrelay_outbox FOR TABLE event_outbox WITH (publish = 'insert', publish_via_partition_root = true);
        ELSE
            CREATE PUBLICATION cdcrelay_outbox FOR TABLE event_outbox WITH (publish = 'insert');
        END IF;
    END IF;
END
$$;
