-- icq: takes the commands table {{table}} back from schema version 3 to schema version 2.
-- Every row of {{history}} moves back into the table (completed, as it was), then the
-- history table is dropped. Stop workers of version 3 first.
WITH moved AS (
    DELETE FROM {{history}}
    RETURNING {{columns}})
INSERT INTO {{table}} ({{columns}}) SELECT {{columns}} FROM moved;
DROP TABLE {{history}};
ALTER TABLE {{table}} RESET (
    autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_threshold,
    autovacuum_vacuum_insert_scale_factor,
    autovacuum_vacuum_insert_threshold,
    autovacuum_vacuum_cost_delay,
    autovacuum_analyze_scale_factor,
    autovacuum_analyze_threshold
);
