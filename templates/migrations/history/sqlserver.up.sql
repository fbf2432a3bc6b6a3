
-- Completed commands move here, in the transaction that stamps them, so the table the
-- claims read holds only pending, running and dead rows. Same columns, nullable (a row
-- another program completed moves whatever it holds); the retention sweep deletes from
-- here by age.
CREATE TABLE {{history}} (
    [Id]             UNIQUEIDENTIFIER NOT NULL,
    [Type]           NVARCHAR(255)    NULL,
    [Payload]        NVARCHAR(MAX)    NULL,
    [CreatedAt]      DATETIME2        NULL,
    [RunAt]          DATETIME2        NULL,
    [Attempts]       INT              NULL,
    [LockToken]      UNIQUEIDENTIFIER NULL,
    [LockedUntil]    DATETIME2        NULL,
    [ProcessedAt]    DATETIME2        NOT NULL,
    [DeadLetteredAt] DATETIME2        NULL,
    [LastError]      NVARCHAR(MAX)    NULL,
    [UserId]         NVARCHAR(255)    NULL,
    [Roles]          NVARCHAR(MAX)    NULL,
    [TenantId]       NVARCHAR(255)    NULL,
    [CorrelationId]  NVARCHAR(255)    NULL,
    [Queue]          NVARCHAR(128)    NULL,
    [Priority]       SMALLINT         NULL,
    [UniqueKey]      NVARCHAR(255)    NULL,
    [TraceParent]    NVARCHAR(255)    NULL,
    [Snoozes]        INT              NULL,
    CONSTRAINT {{pk_history}} PRIMARY KEY ([Id])
);
-- The retention sweep (oldest first) and the completed listing (newest first).
CREATE INDEX {{ix_history}} ON {{history}} ([ProcessedAt], [Id]);
