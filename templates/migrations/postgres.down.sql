-- icq: removes everything the matching up migration created for {{table}}.
DROP TRIGGER IF EXISTS {{notify_trigger}} ON {{table}};
DROP FUNCTION IF EXISTS {{notify_function}}();
DROP TABLE IF EXISTS {{schedules}};
DROP TABLE IF EXISTS {{queues}};
DROP TABLE IF EXISTS {{history}};
DROP TABLE IF EXISTS {{table}};
