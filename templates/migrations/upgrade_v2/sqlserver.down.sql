-- icq: takes the commands table {{table}} back from schema version 2 to schema version 1.
-- Apply with sqlcmd -b -I, DbUp or Flyway. Every row survives, pending ones included, but
-- what version 1 has no column for is lost: each row's queue, priority, unique key, trace
-- context and snooze count. Stop workers that use queues first (they need version 2).
SET ANSI_NULLS ON;
SET QUOTED_IDENTIFIER ON;
GO

SET XACT_ABORT ON;
BEGIN TRANSACTION;

DROP INDEX IF EXISTS {{ix_unique_key}} ON {{table}};
DROP INDEX IF EXISTS {{ix_queue_poll}} ON {{table}};
DROP INDEX IF EXISTS {{ix_poll}} ON {{table}};
ALTER TABLE {{table}} DROP CONSTRAINT IF EXISTS {{df_queue}}, {{df_priority}}, {{df_snoozes}};
ALTER TABLE {{table}} DROP COLUMN [Queue], [Priority], [UniqueKey], [TraceParent], [Snoozes];
-- The version-1 poll: pending rows in RunAt order.
CREATE INDEX {{ix_poll}} ON {{table}} ([RunAt]) INCLUDE ([LockedUntil], [CreatedAt])
    WHERE [ProcessedAt] IS NULL AND [DeadLetteredAt] IS NULL;

COMMIT TRANSACTION;
GO
