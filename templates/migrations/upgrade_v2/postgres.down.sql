-- icq: takes the commands table {{table}} back from schema version 2 to schema version 1.
-- Every row survives, pending ones included, but what version 1 has no column for is lost:
-- each row's queue, priority, unique key, trace context and snooze count. Stop workers
-- that use queues first (they need version 2).
DROP INDEX IF EXISTS {{ix_unique_key_qualified}};
DROP INDEX IF EXISTS {{ix_queue_poll_qualified}};
DROP INDEX IF EXISTS {{ix_poll_qualified}};
ALTER TABLE {{table}}
    DROP COLUMN "Queue",
    DROP COLUMN "Priority",
    DROP COLUMN "UniqueKey",
    DROP COLUMN "TraceParent",
    DROP COLUMN "Snoozes";
-- The version-1 poll: pending rows in ("RunAt", "Id") order.
CREATE INDEX {{ix_poll}} ON {{table}} ("RunAt", "Id")
    WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL;
