
-- Completed commands move here, in the transaction that stamps them, so the table the
-- claims read holds only pending, running and dead rows. Same columns, nullable (a row
-- another program completed moves whatever it holds); the retention sweep deletes from
-- here by age.
CREATE TABLE {{history}} (
    `Id`             CHAR(36)     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    `Type`           VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    `Payload`        JSON         NULL,
    `CreatedAt`      DATETIME(6)  NULL,
    `RunAt`          DATETIME(6)  NULL,
    `Attempts`       INT          NULL,
    `LockToken`      CHAR(36)     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    `LockedUntil`    DATETIME(6)  NULL,
    `ProcessedAt`    DATETIME(6)  NOT NULL,
    `DeadLetteredAt` DATETIME(6)  NULL,
    `LastError`      TEXT         CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    `UserId`         VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    `Roles`          TEXT         CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    `TenantId`       VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    `CorrelationId`  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    `Queue`          VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    `Priority`       SMALLINT     NULL,
    `UniqueKey`      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    `TraceParent`    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    `Snoozes`        INT          NULL,
    PRIMARY KEY (`Id`),
    -- The retention sweep (oldest first) and the completed listing (newest first).
    INDEX {{ix_history}} (`ProcessedAt`, `Id`)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
