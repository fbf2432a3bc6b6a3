-- icq: removes everything the matching up migration created for {{table}}.
-- Its indexes and constraints go with the table. Apply with sqlcmd, DbUp or Flyway.
DROP TABLE IF EXISTS {{schedules}};
DROP TABLE IF EXISTS {{queues}};
DROP TABLE IF EXISTS {{history}};
DROP TABLE IF EXISTS {{table}};
GO
