-- icq: takes the commands table {{table}} back from schema version 4 to schema version 3.
-- Order keys, concurrency keys, attempt errors, pauses, buckets and schedule bookkeeping
-- are dropped; every row stays. Stop workers of version 4 first.
DROP TABLE IF EXISTS {{schedules}};
DROP TABLE IF EXISTS {{queues}};
ALTER TABLE {{history}} DROP COLUMN `Errors`, DROP COLUMN `OrderKey`, DROP COLUMN `ConcurrencyKey`;
ALTER TABLE {{table}} DROP INDEX {{ix_concurrency_key}}, DROP INDEX {{ix_order_key}},
    DROP COLUMN `Errors`, DROP COLUMN `OrderKey`, DROP COLUMN `ConcurrencyKey`,
    ADD INDEX {{ix_retention}} (`ProcessedAt`), ADD INDEX {{ix_dead_letters}} (`DeadLetteredAt`);
