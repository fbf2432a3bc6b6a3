-- icq: takes the commands table {{table}} back from schema version 2 to schema version 1
-- (SQLite 3.35+ for DROP COLUMN). Every row survives, pending ones included, but what
-- version 1 has no column for is lost: each row's queue, priority, unique key, trace
-- context and snooze count. Stop workers that use queues first (they need version 2).
-- The indexes go first: SQLite cannot drop an indexed column. Each DROP COLUMN rewrites
-- the table (about 2 s per million rows each).
DROP INDEX IF EXISTS {{ix_unique_key}};
DROP INDEX IF EXISTS {{ix_queue_poll}};
DROP INDEX IF EXISTS {{ix_poll}};
ALTER TABLE {{table}} DROP COLUMN "Queue";
ALTER TABLE {{table}} DROP COLUMN "Priority";
ALTER TABLE {{table}} DROP COLUMN "UniqueKey";
ALTER TABLE {{table}} DROP COLUMN "TraceParent";
ALTER TABLE {{table}} DROP COLUMN "Snoozes";
-- The version-1 poll: pending rows in RunAt order.
CREATE INDEX {{ix_poll}} ON {{table_unqualified}} ("RunAt", "LockedUntil")
    WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL;
