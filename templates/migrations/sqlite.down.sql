-- icq: removes everything the matching up migration created for {{table}}.
DROP TABLE IF EXISTS {{schedules}};
DROP TABLE IF EXISTS {{queues}};
DROP TABLE IF EXISTS {{history}};
DROP TABLE IF EXISTS {{table}};
