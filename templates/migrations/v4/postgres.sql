-- Schema version 4: the scheduler's columns and the fleet's shared state.
-- "ConcurrencyKey" (commands sharing one run at most a queue's key_concurrency at a time),
-- "OrderKey" (commands sharing one run one at a time, oldest first) and "Errors" (the last
-- 20 failed attempts, a JSON array), on the table and on its history, in that order.
ALTER TABLE {{table}}
    ADD COLUMN "ConcurrencyKey" text NULL,
    ADD COLUMN "OrderKey"       text NULL,
    ADD COLUMN "Errors"         text NULL;
ALTER TABLE {{history}}
    ADD COLUMN "ConcurrencyKey" text NULL,
    ADD COLUMN "OrderKey"       text NULL,
    ADD COLUMN "Errors"         text NULL;
-- The pending rows of one order key, oldest first. No column a claim or a lease renewal
-- changes is in these indexes, so those stay HOT updates.
CREATE INDEX {{ix_order_key}} ON {{table}} ("OrderKey", "CreatedAt", "Id")
    WHERE "OrderKey" IS NOT NULL AND "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL;
-- The pending rows of one concurrency key, to count the running ones.
CREATE INDEX {{ix_concurrency_key}} ON {{table}} ("ConcurrencyKey")
    WHERE "ConcurrencyKey" IS NOT NULL AND "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL;
-- One row per queue someone paused or limited: every replica reads the pause from here,
-- and a rate limit's token bucket lives here (refilled by the database's clock). A queue
-- without a row is not paused.
CREATE TABLE {{queues}} (
    "Queue"         text             NOT NULL PRIMARY KEY,
    "Paused"        boolean          NOT NULL DEFAULT false,
    "PausedAt"      timestamptz      NULL,
    "RateTokens"    double precision NULL,
    "RateCheckedAt" timestamptz      NULL,
    "UpdatedAt"     timestamptz      NOT NULL DEFAULT now()
);
-- One row per recurring schedule: the latest occurrence scheduled. A replica schedules an
-- occurrence only in the transaction that moves "LastOccurrence" forward to it, so racing
-- replicas schedule each occurrence once.
CREATE TABLE {{schedules}} (
    "Name"           text        NOT NULL PRIMARY KEY,
    "LastOccurrence" timestamptz NULL,
    "UpdatedAt"      timestamptz NOT NULL DEFAULT now()
);
