-- Schema version 4: the scheduler's columns and the fleet's shared state.
-- [ConcurrencyKey] (commands sharing one run at most a queue's key_concurrency at a time),
-- [OrderKey] (commands sharing one run one at a time, oldest first) and [Errors] (the last
-- 20 failed attempts, a JSON array), on the table and on its history, in that order.
ALTER TABLE {{table}} ADD [ConcurrencyKey] NVARCHAR(255) NULL, [OrderKey] NVARCHAR(255) NULL, [Errors] NVARCHAR(MAX) NULL;
GO
ALTER TABLE {{history}} ADD [ConcurrencyKey] NVARCHAR(255) NULL, [OrderKey] NVARCHAR(255) NULL, [Errors] NVARCHAR(MAX) NULL;
GO
CREATE INDEX {{ix_order_key}} ON {{table}} ([OrderKey], [CreatedAt], [Id])
    WHERE [OrderKey] IS NOT NULL AND [ProcessedAt] IS NULL AND [DeadLetteredAt] IS NULL;
CREATE INDEX {{ix_concurrency_key}} ON {{table}} ([ConcurrencyKey])
    WHERE [ConcurrencyKey] IS NOT NULL AND [ProcessedAt] IS NULL AND [DeadLetteredAt] IS NULL;
CREATE TABLE {{queues}} (
    [Queue]         NVARCHAR(128) NOT NULL,
    [Paused]        BIT           NOT NULL CONSTRAINT {{df_paused}} DEFAULT 0,
    [PausedAt]      DATETIME2     NULL,
    [RateTokens]    FLOAT         NULL,
    [RateCheckedAt] DATETIME2     NULL,
    [UpdatedAt]     DATETIME2     NOT NULL CONSTRAINT {{df_queues_updated}} DEFAULT SYSUTCDATETIME(),
    CONSTRAINT {{pk_queues}} PRIMARY KEY ([Queue])
);
CREATE TABLE {{schedules}} (
    [Name]           NVARCHAR(200) NOT NULL,
    [LastOccurrence] DATETIME2     NULL,
    [UpdatedAt]      DATETIME2     NOT NULL CONSTRAINT {{df_schedules_updated}} DEFAULT SYSUTCDATETIME(),
    CONSTRAINT {{pk_schedules}} PRIMARY KEY ([Name])
);
GO
