
-- Completed commands move here, in the transaction that stamps them, so the table the
-- claims read holds only pending, running and dead rows. Same columns, nullable (a row
-- another program completed moves whatever it holds, and no column but the id has a type,
-- so a value moves exactly as stored: an INTEGER time stays an integer); the retention sweep
-- deletes from here by age.
CREATE TABLE {{history}} (
    "Id"             TEXT    NOT NULL PRIMARY KEY,
    "Type"                   NULL,
    "Payload"                NULL,
    "CreatedAt"              NULL,
    "RunAt"                  NULL,
    "Attempts"               NULL,
    "LockToken"              NULL,
    "LockedUntil"            NULL,
    "ProcessedAt"            NOT NULL,
    "DeadLetteredAt"         NULL,
    "LastError"              NULL,
    "UserId"                 NULL,
    "Roles"                  NULL,
    "TenantId"               NULL,
    "CorrelationId"          NULL,
    "Queue"                  NULL,
    "Priority"               NULL,
    "UniqueKey"              NULL,
    "TraceParent"            NULL,
    "Snoozes"                NULL
);
-- The retention sweep (oldest first) and the completed listing (newest first).
CREATE INDEX {{ix_history}} ON {{history_unqualified}} ("ProcessedAt", "Id");
