-- icq: takes the commands table {{table}} back from schema version 2 to schema version 1,
-- in one ALTER TABLE. Every row survives, pending ones included, but what version 1 has no
-- column for is lost: each row's queue, priority, unique key, trace context and snooze
-- count. Stop workers that use queues first (they need version 2).
ALTER TABLE {{table}}
    DROP INDEX {{ix_unique_key}},
    DROP INDEX {{ix_queue_poll}},
    DROP INDEX {{ix_poll}},
    DROP COLUMN `PendingUniqueKey`,
    DROP COLUMN `PollQueue`,
    DROP COLUMN `Queue`,
    DROP COLUMN `Priority`,
    DROP COLUMN `UniqueKey`,
    DROP COLUMN `TraceParent`,
    DROP COLUMN `Snoozes`,
    ADD INDEX {{ix_poll}} (`ProcessedAt`, `DeadLetteredAt`, `RunAt`);
