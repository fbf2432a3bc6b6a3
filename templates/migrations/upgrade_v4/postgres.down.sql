-- icq: takes the commands table {{table}} back from schema version 4 to schema version 3.
-- Order keys, concurrency keys, attempt errors, pauses, buckets and schedule bookkeeping
-- are dropped; every row stays. Stop workers of version 4 first.
DROP TABLE IF EXISTS {{schedules}};
DROP TABLE IF EXISTS {{queues}};
DROP INDEX IF EXISTS {{ix_concurrency_key_qualified}};
DROP INDEX IF EXISTS {{ix_order_key_qualified}};
ALTER TABLE {{history}} DROP COLUMN "Errors", DROP COLUMN "OrderKey", DROP COLUMN "ConcurrencyKey";
ALTER TABLE {{table}} DROP COLUMN "Errors", DROP COLUMN "OrderKey", DROP COLUMN "ConcurrencyKey";
