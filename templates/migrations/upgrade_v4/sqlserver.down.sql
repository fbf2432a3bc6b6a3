-- icq: takes the commands table {{table}} back from schema version 4 to schema version 3.
-- Order keys, concurrency keys, attempt errors, pauses, buckets and schedule bookkeeping
-- are dropped; every row stays. Stop workers of version 4 first.
DROP TABLE IF EXISTS {{schedules}};
DROP TABLE IF EXISTS {{queues}};
DROP INDEX IF EXISTS {{ix_concurrency_key}} ON {{table}};
DROP INDEX IF EXISTS {{ix_order_key}} ON {{table}};
GO
ALTER TABLE {{history}} DROP COLUMN [Errors], [OrderKey], [ConcurrencyKey];
ALTER TABLE {{table}} DROP COLUMN [Errors], [OrderKey], [ConcurrencyKey];
GO
