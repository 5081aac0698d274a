-- The publication cdcrelay streams: inserts into the outbox only. It must
-- exist before the replication slot. Run as the table's owner.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'cdcrelay_outbox') THEN
        CREATE PUBLICATION cdcrelay_outbox FOR TABLE event_outbox WITH (publish = 'insert');
    END IF;
END
$$;
