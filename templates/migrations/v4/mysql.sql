-- Schema version 4: the scheduler's columns and the fleet's shared state.
-- `ConcurrencyKey` (commands sharing one run at most a queue's key_concurrency at a time),
-- `OrderKey` (commands sharing one run one at a time, oldest first) and `Errors` (the last
-- 20 failed attempts, a JSON array), on the table and on its history, in that order.
-- Keys are utf8mb4_bin, which ignores trailing spaces: two keys that differ only by them
-- share one limit and one order.
ALTER TABLE {{table}}
    ADD COLUMN `ConcurrencyKey` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    ADD COLUMN `OrderKey`       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    ADD COLUMN `Errors`         MEDIUMTEXT   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    ADD INDEX {{ix_order_key}} (`OrderKey`, `CreatedAt`, `Id`),
    ADD INDEX {{ix_concurrency_key}} (`ConcurrencyKey`);
ALTER TABLE {{history}}
    ADD COLUMN `ConcurrencyKey` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    ADD COLUMN `OrderKey`       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    ADD COLUMN `Errors`         MEDIUMTEXT   CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL;
-- One row per queue someone paused or limited: every replica reads the pause from here,
-- and a rate limit's token bucket lives here. A queue without a row is not paused.
CREATE TABLE {{queues}} (
    `Queue`         VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `Paused`        TINYINT(1)   NOT NULL DEFAULT 0,
    `PausedAt`      DATETIME(6)  NULL,
    `RateTokens`    DOUBLE       NULL,
    `RateCheckedAt` DATETIME(6)  NULL,
    `UpdatedAt`     DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (`Queue`)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- One row per recurring schedule: the latest occurrence scheduled. A replica schedules an
-- occurrence only in the transaction that moves `LastOccurrence` forward to it, so racing
-- replicas schedule each occurrence once.
CREATE TABLE {{schedules}} (
    `Name`           VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `LastOccurrence` DATETIME(6)  NULL,
    `UpdatedAt`      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (`Name`)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
