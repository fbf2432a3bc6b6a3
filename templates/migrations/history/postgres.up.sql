
-- Completed commands move here, in the statement that stamps them, so the table the
-- claims read holds only pending, running and dead rows: its size follows the work in
-- flight, not throughput times retention. Same columns, nullable (a row another program
-- completed moves whatever it holds); no trigger (nothing waits for history). The
-- retention sweep deletes from here by age.
CREATE TABLE {{history}} (
    "Id"             uuid        NOT NULL PRIMARY KEY,
    "Type"           text        NULL,
    "Payload"        jsonb       NULL,
    "CreatedAt"      timestamptz NULL,
    "RunAt"          timestamptz NULL,
    "Attempts"       integer     NULL,
    "LockToken"      uuid        NULL,
    "LockedUntil"    timestamptz NULL,
    "ProcessedAt"    timestamptz NOT NULL DEFAULT now(),
    "DeadLetteredAt" timestamptz NULL,
    "LastError"      text        NULL,
    "UserId"         text        NULL,
    "Roles"          text        NULL,
    "TenantId"       text        NULL,
    "CorrelationId"  text        NULL,
    "Queue"          text        NULL,
    "Priority"       smallint    NULL,
    "UniqueKey"      text        NULL,
    "TraceParent"    text        NULL,
    "Snoozes"        integer     NULL
);
-- The retention sweep (oldest first) and the completed listing (newest first).
CREATE INDEX {{ix_history}} ON {{history}} ("ProcessedAt", "Id");

-- Autovacuum for the commands table by dead rows, not by its size: every command leaves a
-- dead version (its move to history), and the table stays small, so the default 20% of
-- the table would vacuum it almost never while it is busy and constantly while it is
-- nearly empty. A fixed 1,000 dead (or inserted) rows, no cost pause (vacuuming a table of
-- the work in flight takes milliseconds), and statistics refreshed as often, so the claim
-- plans see the backlog as it is.
ALTER TABLE {{table}} SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 1000
);
