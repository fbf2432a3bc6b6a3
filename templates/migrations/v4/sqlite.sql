-- Schema version 4: the scheduler's columns and the fleet's shared state.
-- "ConcurrencyKey" (commands sharing one run at most a queue's key_concurrency at a time),
-- "OrderKey" (commands sharing one run one at a time, oldest first) and "Errors" (the last
-- 20 failed attempts, a JSON array), on the table and on its history, in that order.
ALTER TABLE {{table}} ADD COLUMN "ConcurrencyKey" TEXT NULL;
ALTER TABLE {{table}} ADD COLUMN "OrderKey" TEXT NULL;
ALTER TABLE {{table}} ADD COLUMN "Errors" TEXT NULL;
ALTER TABLE {{history}} ADD COLUMN "ConcurrencyKey" TEXT NULL;
ALTER TABLE {{history}} ADD COLUMN "OrderKey" TEXT NULL;
ALTER TABLE {{history}} ADD COLUMN "Errors" TEXT NULL;
-- The pending rows of one order key, oldest first.
CREATE INDEX {{ix_order_key}} ON {{table_unqualified}} ("OrderKey", "CreatedAt", "Id")
    WHERE "OrderKey" IS NOT NULL AND "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL;
-- The pending rows of one concurrency key, to count the running ones.
CREATE INDEX {{ix_concurrency_key}} ON {{table_unqualified}} ("ConcurrencyKey")
    WHERE "ConcurrencyKey" IS NOT NULL AND "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL;
-- One row per queue someone paused or limited: every replica reads the pause from here,
-- and a rate limit's token bucket lives here. A queue without a row is not paused.
CREATE TABLE {{queues}} (
    "Queue"         TEXT    NOT NULL PRIMARY KEY,
    "Paused"        INTEGER NOT NULL DEFAULT 0,
    "PausedAt"      TEXT    NULL,
    "RateTokens"    REAL    NULL,
    "RateCheckedAt" TEXT    NULL,
    "UpdatedAt"     TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
-- One row per recurring schedule: the latest occurrence scheduled. A replica schedules an
-- occurrence only in the transaction that moves "LastOccurrence" forward to it, so racing
-- replicas schedule each occurrence once.
CREATE TABLE {{schedules}} (
    "Name"           TEXT NOT NULL PRIMARY KEY,
    "LastOccurrence" TEXT NULL,
    "UpdatedAt"      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
