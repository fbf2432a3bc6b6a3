-- icq: takes the commands table {{table}} back from schema version 3 to schema version 2.
-- Every row of {{history}} moves back into the table (completed, as it was), then the
-- history table is dropped. Stop workers of version 3 first.
INSERT INTO {{table}} ({{columns}}) SELECT {{columns}} FROM {{history}};
DROP TABLE {{history}};
