-- icq: takes the commands table {{table}} back from schema version 3 to schema version 2
-- (SQL Server 2016+). Every row of {{history}} moves back into the table (completed, as it
-- was), then the history table is dropped. Stop workers of version 3 first.
-- Apply with sqlcmd -b -I, DbUp or Flyway.
SET XACT_ABORT ON;
BEGIN TRANSACTION;

-- (An INSERT, not DELETE ... OUTPUT INTO: the table's CHECK constraint rules that out.)
INSERT INTO {{table}} ({{columns}}) SELECT {{columns}} FROM {{history}};
DROP TABLE {{history}};

COMMIT TRANSACTION;
GO
