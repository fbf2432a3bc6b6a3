//! SQLite: every statement icq runs against a SQLite source.
//!
//! SQLite has one writer at a time, so a claim is a single `UPDATE … RETURNING` and the
//! pool waits on the busy timeout rather than failing. Timestamps are UTC text in the
//! fixed format of [`crate::command::format_timestamp`], so text order is time order.
//! icq's own connections sync every commit to disk (`synchronous = FULL`), except the
//! processor's claims, stamps and lease renewals: a power loss may undo those (their
//! commands run again), and none of them creates a command ([`SqliteDriver::connect`]).

mod admin;
mod control;
mod doctor;
mod limited;
mod recurring;
mod warm;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::TryStreamExt;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Either, Executor, Row, Sqlite, ValueRef};
use tokio::sync::Notify;

use chrono::{DateTime, Utc};

use super::decode::{Decoder, text_columns, text_id, text_token};
use super::{
    Activity, BenchFillCompletedParams, BenchOps, ClaimParams, ClaimedRow, CommandGetParams,
    CommandInsertManyParams, CommandInsertParams, CommandSetStateAndClaimParams,
    CommandSetStateManyParams, ConnectOptions, Lease, LeaseCheckManyParams, LeaseExtendManyParams,
    LeaseOthersAtHeadParams, Lifecycle, QueueOps, SetState, SweepParams,
};
use crate::command::{
    CommandId, CommandRow, NewCommand, RunAt, Scheduled, format_timestamp, parse_timestamp,
};
use crate::error::{Error, Result};
use crate::ident::{Engine, TableName};
use crate::redact::redact_url;
use warm::Warm;

/// SQL for "now" in icq's stored format.
pub(crate) const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// A SQLite source: its pool, table and SQL text.
pub struct SqliteDriver {
    pub(crate) pool: SqlitePool,
    pub(crate) table: TableName,
    /// The quoted table name.
    pub(crate) t: String,
    /// The quoted name of its history table (schema version 3).
    pub(crate) h: String,
    sql: Sql,
    /// When [`MISSORTED_RUN_AT_DEAD`] last ran (it scans the scheduled rows, so it runs
    /// at most twice per lease period, not with every claim).
    missorted_scanned_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// The table's schema version, once looked up.
    version: super::SchemaVersionCache,
    /// When a claim last looked for rows no claim in due order settles.
    unusable: super::UnusableGate,
    /// The pool is the application's ([`SqliteDriver::from_pool`]): closing the driver
    /// leaves it open.
    shared_pool: bool,
    /// When a claim last looked for pending rows whose `Id` is not text.
    unusable_ids: super::UnusableGate,
    /// The processor's connections kept between its statements (claims, stamps, lease
    /// renewals) while it runs; never on the application's pool, which it may close while
    /// the driver lives.
    warm: warm::WarmConnections<sqlx::Sqlite>,
    /// The processor's claims and stamps take turns here before they take the database's
    /// one write lock: contenders in one process otherwise wait in SQLite's busy handler,
    /// whose sleeps grow to 100 ms, instead of starting the moment the last write ends.
    /// Lease renewals do not queue here ([`SqliteDriver::work_connection`]).
    writing: tokio::sync::Mutex<()>,
    /// How claims name the rows they pick, once looked up ([`SqliteDriver::row_key`]).
    row_key: std::sync::Mutex<Option<&'static str>>,
}

struct Sql {
    insert: Arc<str>,
    /// The pending row holding a unique key.
    pending_by_key: Arc<str>,
    /// Claims, by shape.
    claims: super::SqlCache<ClaimKey>,
    /// The set-state statement of a version-1 table (no `Snoozes`).
    set_state_v1: Arc<str>,
    /// The set-state statement of a version-2 table.
    set_state_v2: Arc<str>,
    /// The set-state statement of a version-4 table: a failure also writes `Errors`.
    set_state_v4: Arc<str>,
    extend: Arc<str>,
    check: Arc<str>,
    sweep: Arc<str>,
    activity: Arc<str>,
    /// `activity` of a version-2 table's queues (`?1`, a JSON array).
    activity_in: Arc<str>,
    unusable_ids_exist: Arc<str>,
    unusable_ids_dead: Arc<str>,
    /// On a version-3 table, the move of the rows the set-state statement completed
    /// (`?1` the same stamps); the second on a version-4 table (with its columns).
    move_completed: [[Arc<str>; 2]; 2],
    /// A version-3 sweep's move of the oldest completed rows left in the table (`?1`
    /// limit): copy, then delete, in one transaction; the second on a version-4 table.
    sweep_move: [[Arc<str>; 2]; 2],
    /// A version-3 sweep's delete of old history (`?1` offset, `?2` limit).
    sweep_history: Arc<str>,
}

/// The shape of a claim statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ClaimKey {
    /// A version-2 table: `Priority`, `RunAt` order, queues.
    v2: bool,
    /// A version-3 table: the stamps move completed rows to history.
    history: bool,
    /// A version-4 table: claims return its columns and moves carry them.
    v4: bool,
    /// Only these types (a JSON array).
    types: bool,
    queues: super::QueueFilter,
    /// Also the rows no claim in due order settles (see [`claim_sql`]): every claim on
    /// a version-1 table, now and then on version 2 ([`super::UNUSABLE_EVERY`]).
    unusable: bool,
    /// First stamp outcomes (a JSON array, the last parameter), in the same transaction
    /// and the same call (see [`claim_sql`]), and never claim their rows (a JSON array of
    /// their ids, the parameter before).
    stamps: bool,
    /// How the claim names the rows it picks ([`SqliteDriver::row_key`]).
    row: &'static str,
    /// Skips rows of paused queues (a version-4 table with a queue paused).
    paused: bool,
}

fn insert_sql(t: &str) -> String {
    format!(
        r#"INSERT INTO {t} ("Id", "Type", "Payload", "RunAt", "UserId", "Roles", "TenantId", "CorrelationId")
           VALUES {INSERT_ROW}"#
    )
}

/// The version-2 insert of `rows` rows; `keyed` (one row with a unique key) inserts
/// nothing when a pending row holds the key, and returns the id when it inserts. With
/// `v4` it names the order and concurrency keys too.
fn insert_v2_sql(t: &str, rows: usize, keyed: bool, v4: bool) -> Arc<str> {
    let (keys, row) = if v4 {
        (r#", "OrderKey", "ConcurrencyKey""#, INSERT_ROW_V4)
    } else {
        ("", INSERT_ROW_V2)
    };
    let conflict = if keyed {
        r#"
           ON CONFLICT ("UniqueKey") WHERE "UniqueKey" IS NOT NULL AND "ProcessedAt" IS NULL
               AND "DeadLetteredAt" IS NULL DO NOTHING
           RETURNING "Id""#
    } else {
        ""
    };
    format!(
        r#"INSERT INTO {t} ("Id", "Type", "Payload", "RunAt", "UserId", "Roles", "TenantId", "CorrelationId",
                            "Queue", "Priority", "UniqueKey", "TraceParent"{keys})
           VALUES {}{conflict}"#,
        vec![row; rows].join(", ")
    )
    .into()
}

/// One row of an insert: nine parameters.
const INSERT_ROW: &str =
    "(?, ?, ?, COALESCE(?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?)), ?, ?, ?, ?)";

/// One row of a version-2 insert: thirteen parameters.
const INSERT_ROW_V2: &str =
    "(?, ?, ?, COALESCE(?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?)), ?, ?, ?, ?, ?, ?, ?, ?)";

/// One row of a version-2 insert naming the order and concurrency keys too (schema
/// version 4): fifteen parameters.
const INSERT_ROW_V4: &str = "(?, ?, ?, COALESCE(?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?)), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// The columns a claim returns from a version-1 table, named: a statement prepared with
/// `RETURNING *` keeps the column count it was prepared with in sqlx's statement cache,
/// and once the table gained columns (an upgrade while a worker runs) the next claim
/// read past them and crashed the connection's worker thread.
const COLUMNS_V1: &str = r#""Id", "Type", "Payload", "CreatedAt", "RunAt", "Attempts", "LockToken", "LockedUntil", "ProcessedAt", "DeadLetteredAt", "LastError", "UserId", "Roles", "TenantId", "CorrelationId""#;

/// [`COLUMNS_V1`] and the version-2 columns.
const COLUMNS_V2: &str = r#""Id", "Type", "Payload", "CreatedAt", "RunAt", "Attempts", "LockToken", "LockedUntil", "ProcessedAt", "DeadLetteredAt", "LastError", "UserId", "Roles", "TenantId", "CorrelationId", "Queue", "Priority", "UniqueKey", "TraceParent", "Snoozes""#;

/// [`COLUMNS_V2`] and the version-4 columns.
const COLUMNS_V4: &str = r#""Id", "Type", "Payload", "CreatedAt", "RunAt", "Attempts", "LockToken", "LockedUntil", "ProcessedAt", "DeadLetteredAt", "LastError", "UserId", "Roles", "TenantId", "CorrelationId", "Queue", "Priority", "UniqueKey", "TraceParent", "Snoozes", "ConcurrencyKey", "OrderKey", "Errors""#;

/// Rows per multi-row insert (13 parameters each at most, well under SQLite's limit).
const INSERT_ROWS_PER_STATEMENT: usize = 500;

/// The claim: one `UPDATE … RETURNING`. `Attempts` saturates below `i32::MAX`.
///
/// SQLite compares text as text, so a `RunAt` or `CreatedAt` another program wrote as
/// `'tomorrow'` sorts after every real timestamp and would never be due: rows whose
/// `RunAt` sorts after `'9999'` (text from `':'` on, or a BLOB) or is NULL (another
/// program relaxed NOT NULL) are claimed as well, a few at a time from the same index,
/// and the executor dead-letters them with the column named (the NULLs in an arm of
/// their own: `OR "RunAt" IS NULL` would turn the seek into a scan of every pending row,
/// while `IS NULL` alone is a seek, or nothing at all on a NOT NULL column); a NULL
/// `CreatedAt` is no
/// reason to wait. `Attempts` counts the claim only when it is a count below `i32::MAX`
/// (NULL, negative and huge counts stay as stored, for the executor to name). A `LockedUntil` that is not a time (text from `':'` on) holds no lease:
/// it would otherwise look held forever, so the row is claimed and the lease rewritten.
/// Rows whose `Id` is not text are left to [`UNUSABLE_IDS_DEAD`].
///
/// On a version-2 table the due rows come in `Priority`, `RunAt` order (the poll index
/// leads with `Priority`, so the arms for rows that never sort as due are not seeks
/// there: they run now and then, [`super::UNUSABLE_EVERY`], in one arm that also takes
/// rows whose `Queue` is NULL, which no queue filter matches).
/// Leaves out the rows of `t` whose queue is paused in its queue-state table
/// (`<table>Queues`, whose quoted name is `t`'s with `Queues` before the closing quote).
fn paused_filter(t: &str) -> String {
    let q = format!("{}Queues\"", &t[..t.len() - 1]);
    format!(
        "\n                 AND NOT EXISTS (SELECT 1 FROM {q} AS p \
         WHERE p.\"Queue\" = {t}.\"Queue\" AND p.\"Paused\")"
    )
}

fn claim_sql(t: &str, h: &str, key: ClaimKey) -> String {
    // Parameters after the first four, in order: types, queue(s), the ids to leave out.
    let mut n = 5;
    let mut type_filter = String::new();
    if key.types {
        type_filter.push_str(&format!(
            "\n                 AND \"Type\" IN (SELECT value FROM json_each(?{n}))"
        ));
        n += 1;
    }
    let queue_filter = match key.queues {
        super::QueueFilter::All => String::new(),
        super::QueueFilter::One => {
            n += 1;
            format!("\n                 AND \"Queue\" = ?{}", n - 1)
        }
        super::QueueFilter::Many => {
            n += 1;
            format!(
                "\n                 AND \"Queue\" IN (SELECT value FROM json_each(?{}))",
                n - 1
            )
        }
    };
    if key.stamps {
        type_filter.push_str(&format!(
            "\n                 AND \"Id\" NOT IN (SELECT value FROM json_each(?{n}))"
        ));
        n += 1;
    }
    if key.paused {
        type_filter.push_str(&paused_filter(t));
    }
    let lease_free =
        format!(r#"("LockedUntil" IS NULL OR "LockedUntil" <= {NOW} OR "LockedUntil" >= ':')"#);
    let row = key.row;
    let order = if key.v2 {
        r#""Priority", "RunAt""#
    } else {
        r#""RunAt""#
    };
    let due = format!(
        r#"SELECT {row} FROM (
                   SELECT {row} FROM {t}
                   WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL
                     AND "RunAt" <= {NOW}
                     AND {lease_free}
                     AND ("CreatedAt" <= strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?3)
                          OR "CreatedAt" >= ':' OR "CreatedAt" IS NULL){type_filter}{queue_filter}
                     AND typeof("Id") = 'text'{ordered}
                   ORDER BY {order}
                   LIMIT ?4)"#,
        ordered = if key.v4 {
            ordered_filter(t)
        } else {
            String::new()
        }
    );
    let unusable = match (key.unusable, key.v2) {
        (false, _) => String::new(),
        (true, false) => format!(
            r#"
               UNION ALL
               SELECT {row} FROM (
                   SELECT {row} FROM {t}
                   WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL
                     AND "RunAt" >= ':'
                     AND {lease_free}{type_filter}
                     AND typeof("Id") = 'text'
                   LIMIT 10)
               UNION ALL
               SELECT {row} FROM (
                   SELECT {row} FROM {t}
                   WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL
                     AND "RunAt" IS NULL
                     AND {lease_free}{type_filter}
                     AND typeof("Id") = 'text'
                   LIMIT 10)"#
        ),
        (true, true) => format!(
            r#"
               UNION ALL
               SELECT {row} FROM (
                   SELECT {row} FROM {t}
                   WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL
                     AND ("RunAt" >= ':' OR "RunAt" IS NULL OR "Queue" IS NULL)
                     AND {lease_free}{type_filter}
                     AND typeof("Id") = 'text'
                   LIMIT 10)"#
        ),
    };
    let claim = format!(
        r#"UPDATE {t}
           SET "LockToken" = ?1, "LockedUntil" = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?2),
               "Attempts" = CASE WHEN "Attempts" BETWEEN 0 AND 2147483646 THEN "Attempts" + 1
                                 ELSE "Attempts" END
           WHERE {row} IN (
               {due}{unusable})
           RETURNING {returning}, {NOW} AS "IcqNow""#,
        returning = if key.v4 {
            COLUMNS_V4
        } else if key.v2 {
            COLUMNS_V2
        } else {
            COLUMNS_V1
        }
    );
    if !key.stamps {
        return claim;
    }
    // `n` is the next free parameter: the stamps' JSON array.
    let stamp = set_state_sql(t, key.v2, n, key.v4);
    let moves = if key.history {
        move_completed_sql(t, h, n, if key.v4 { 4 } else { 3 })
            .into_iter()
            .map(|statement| format!("{statement};\n"))
            .collect()
    } else {
        String::new()
    };
    format!("BEGIN IMMEDIATE;\n{stamp};\n{moves}{claim};\nCOMMIT")
}

/// The ordered-key condition of the claim's due rows of `t` (version 4): a row with an
/// `OrderKey` is claimable only when no other pending row of its key is older by
/// (`CreatedAt`, `Id`), so a key's rows run one at a time in the order they were
/// scheduled, and one that runs or waits for a retry holds the younger ones until it
/// completes or is dead-lettered. A row without a key stops at `IS NULL`; a keyed one is
/// a seek in the partial `IX_<t>_OrderKey`. The stamps of a stamp-and-claim come first in
/// its transaction, so a head completed there frees the next row for the same claim.
fn ordered_filter(t: &str) -> String {
    format!(
        r#"
                     AND ("OrderKey" IS NULL OR NOT EXISTS (
                          SELECT 1 FROM {t} AS o
                          WHERE o."OrderKey" = {t}."OrderKey"
                            AND o."ProcessedAt" IS NULL AND o."DeadLetteredAt" IS NULL
                            AND (o."CreatedAt", o."Id") < ({t}."CreatedAt", {t}."Id")))"#
    )
}

/// The statements a stamp-and-claim string runs: `BEGIN`, the stamp, on a version-3
/// table the two of [`move_completed_sql`], the claim, `COMMIT`.
fn stamp_claim_statements(history: bool) -> usize {
    if history { 6 } else { 4 }
}

/// On a version-3 table, after the stamp of parameter `?param` and in its transaction:
/// the rows it completed move to history `h` (copied, then deleted from `t`). The stamp
/// was guarded by the lease token; these take the rows it completed, so a stale success
/// stamp moves nothing. An id history already holds (scheduled anew with the same id)
/// keeps its newest completion.
fn move_completed_sql(t: &str, h: &str, param: usize, version: u32) -> [String; 2] {
    let columns = crate::engine::column_list(Engine::Sqlite, "", version);
    let upsert = crate::engine::history_upsert(Engine::Sqlite, version);
    // sqlx binds a parameter SQLite reports without a name (an index below the highest
    // `?NNN` that the statement does not use) positionally, counting on from the string's
    // earlier statements, and stops binding past the last argument: a statement after
    // the first that named only `?param` would run with it NULL. So every earlier
    // parameter is named here too (a constant condition, true).
    let named = (1..param).map(|i| format!("?{i}, ")).collect::<String>();
    let completed = format!(
        r#""Id" IN (SELECT id FROM ({}) WHERE kind = 0) AND "ProcessedAt" IS NOT NULL
           AND coalesce({named}0, 0) IS NOT NULL"#,
        leases_table(param)
    );
    [
        format!(
            r#"INSERT INTO {h} ({columns}) SELECT {columns} FROM {t} WHERE {completed}
               ON CONFLICT ("Id") DO UPDATE SET {upsert}"#
        ),
        format!("DELETE FROM {t} WHERE {completed}"),
    ]
}

/// Every outcome kind in one statement: 0 completed, 1 retry, 2 dead, 3 release, 4
/// snooze (a release with a move that, on a version-2 table, counts itself in
/// `Snoozes`, saturating). With `v4` a retry or a dead-letter also writes `Errors` from
/// the stamp's `errors` (the array the processor computed; NULL leaves it as it is).
fn set_state_sql(t: &str, v2: bool, param: usize, v4: bool) -> String {
    let errors = if v4 {
        r#""Errors" = CASE WHEN s.kind IN (1, 2) AND s.errors IS NOT NULL
                                 THEN s.errors ELSE c."Errors" END,
               "#
    } else {
        ""
    };
    let snoozes = if v2 {
        r#""Snoozes" = CASE WHEN s.kind = 4 AND c."Snoozes" < 2147483647
                                  THEN c."Snoozes" + 1 ELSE c."Snoozes" END,
               "#
    } else {
        ""
    };
    let leases = leases_table(param);
    format!(
        r#"UPDATE {t} AS c
           SET "ProcessedAt" = CASE WHEN s.kind = 0 THEN {NOW} ELSE c."ProcessedAt" END,
               "DeadLetteredAt" = CASE WHEN s.kind = 2 THEN {NOW} ELSE c."DeadLetteredAt" END,
               "RunAt" = CASE WHEN s.delay IS NOT NULL
                              THEN strftime('%Y-%m-%dT%H:%M:%fZ', 'now', s.delay)
                              ELSE c."RunAt" END,
               "LastError" = CASE WHEN s.kind IN (1, 2) THEN s.error ELSE c."LastError" END,
               "Attempts" = CASE WHEN s.kind IN (3, 4) THEN MAX(c."Attempts" - 1, 0)
                                 ELSE c."Attempts" END,
               {errors}{snoozes}"LockToken" = NULL, "LockedUntil" = NULL
           FROM ({leases}) AS s
           WHERE c."Id" = s.id AND c."LockToken" = s.token"#
    )
}

fn activity_sql(t: &str, filter: &str) -> String {
    format!(
        r#"SELECT
               COALESCE(SUM(CASE WHEN "LockedUntil" IS NULL OR "LockedUntil" <= {NOW} THEN 1 ELSE 0 END), 0) AS due,
               COALESCE(SUM(CASE WHEN "LockedUntil" > {NOW} THEN 1 ELSE 0 END), 0) AS running
           FROM {t}
           WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL
             AND ("RunAt" <= {NOW} OR "RunAt" >= ':' OR "RunAt" IS NULL
                  OR "LockedUntil" > {NOW}){filter}"#
    )
}

/// Whether a row's `Id` is not text (a BLOB another program wrote, or NULL, which a
/// table without `NOT NULL` on its primary key takes): such a row can be neither leased
/// nor stamped by id. Text sorts before BLOBs and NULL before everything, so this is two
/// seeks on the primary key.
const UNUSABLE_IDS_EXIST: &str = r#"SELECT EXISTS (SELECT 1 FROM {t} WHERE "Id" >= X''
    AND "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL)
    OR EXISTS (SELECT 1 FROM {t} WHERE "Id" IS NULL
    AND "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL)"#;

/// Dead-letters the pending rows [`UNUSABLE_IDS_EXIST`] finds, saying why.
const UNUSABLE_IDS_DEAD: &str = r#"UPDATE {t}
    SET "DeadLetteredAt" = {NOW}, "LockToken" = NULL, "LockedUntil" = NULL,
        "LastError" = CASE WHEN "Id" IS NULL
            THEN 'icq cannot use this row: its Id is NULL, so it can be neither leased nor stamped; ids are text'
            ELSE 'icq cannot use this row: its Id is a ' || typeof("Id") || ' (X''' ||
                 hex(substr("Id", 1, 64)) || '''), not text, so it can be neither leased nor stamped; ids are text'
            END
    WHERE ("Id" >= X'' OR "Id" IS NULL) AND "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#;

/// Dead-letters pending rows whose `RunAt` is text that sorts after now, is not an
/// ISO-8601 time, and reads as a number of Unix seconds already past — a number stored
/// as text such as `'2461000.5'` (a Julian day to SQLite's date functions; 1970-01-29 as
/// Unix seconds): icq reads it as due, but text compares as text, so no claim would
/// ever find it. (Unix seconds as text still ahead, `'4102444800'`, stay scheduled: text
/// order and instant agree until then.) A scan of the scheduled part of the poll index
/// (`RunAt` is in it), a hundred rows at a time. Integer and real times compare below
/// text and are claimed as due, so they are never touched here.
const MISSORTED_RUN_AT_DEAD: &str = r#"UPDATE {t}
    SET "DeadLetteredAt" = {NOW}, "LockToken" = NULL, "LockedUntil" = NULL,
        "LastError" = 'row cannot be processed: column RunAt: `' || substr("RunAt", 1, 64) ||
            '` is text but not an ISO-8601 time: read as Unix seconds it is already due, yet as text it sorts after every timestamp, so no claim would find it (a Julian day? SQLite''s date functions read numbers so); store ISO-8601 UTC text or an INTEGER/REAL number of Unix seconds'
    WHERE "Id" IN (SELECT "Id" FROM {t}
        WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL
          AND "RunAt" > {NOW} AND "RunAt" < ':'
          AND typeof("RunAt") = 'text'
          AND "RunAt" NOT GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]*'
          AND CAST("RunAt" AS REAL) <= CAST(strftime('%s', 'now') AS REAL)
          AND ("LockedUntil" IS NULL OR "LockedUntil" <= {NOW} OR "LockedUntil" >= ':')
        LIMIT 100)"#;

/// The rows of parameter `?param`, a JSON array of `[id, token, kind, delay, error]`
/// arrays (see [`leases_json`]).
fn leases_table(param: usize) -> String {
    format!(
        "SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token, \
         json_extract(value, '$[2]') AS kind, json_extract(value, '$[3]') AS delay, \
         json_extract(value, '$[4]') AS error, json_extract(value, '$[5]') AS errors \
         FROM json_each(?{param})"
    )
}

impl Sql {
    fn new(t: &str, h: &str) -> Sql {
        // The oldest completed rows of the table, by the retention index.
        let oldest = format!(
            r#""Id" IN (SELECT "Id" FROM {t} WHERE "ProcessedAt" IS NOT NULL
                        ORDER BY "ProcessedAt", "Id" LIMIT ?1)"#
        );
        let sweep_move = |version| {
            let columns = crate::engine::column_list(Engine::Sqlite, "", version);
            [
                format!(
                    r#"INSERT INTO {h} ({columns}) SELECT {columns} FROM {t} WHERE {oldest}
                       ON CONFLICT ("Id") DO UPDATE SET {upsert}"#,
                    upsert = crate::engine::history_upsert(Engine::Sqlite, version)
                )
                .into(),
                format!("DELETE FROM {t} WHERE {oldest}").into(),
            ]
        };
        Sql {
            move_completed: [3, 4]
                .map(|version| move_completed_sql(t, h, 1, version).map(Arc::from)),
            sweep_move: [sweep_move(3), sweep_move(4)],
            sweep_history: format!(
                r#"DELETE FROM {h} WHERE "Id" IN (
                       SELECT "Id" FROM {h}
                       WHERE "ProcessedAt" < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?1)
                       ORDER BY "ProcessedAt" LIMIT ?2)"#
            )
            .into(),
            insert: insert_sql(t).into(),
            pending_by_key: pending_by_key_sql(t).into(),
            claims: Default::default(),
            set_state_v1: set_state_sql(t, false, 1, false).into(),
            set_state_v2: set_state_sql(t, true, 1, false).into(),
            set_state_v4: set_state_sql(t, true, 1, true).into(),
            extend: format!(
                r#"UPDATE {t} AS c SET "LockedUntil" = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?2)
                   FROM ({leases}) AS s
                   WHERE c."Id" = s.id AND c."LockToken" = s.token
                   RETURNING "Id", "LockToken""#,
                leases = leases_table(1)
            )
            .into(),
            check: format!(
                r#"SELECT c."Id", c."LockToken" FROM {t} AS c JOIN ({leases}) AS s
                     ON c."Id" = s.id AND c."LockToken" = s.token
                   WHERE c."ProcessedAt" IS NULL AND c."DeadLetteredAt" IS NULL"#,
                leases = leases_table(1)
            )
            .into(),
            sweep: format!(
                r#"DELETE FROM {t} WHERE "Id" IN (
                       SELECT "Id" FROM {t}
                       WHERE "ProcessedAt" IS NOT NULL
                         AND "ProcessedAt" < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?1)
                       ORDER BY "ProcessedAt" LIMIT ?2)"#
            )
            .into(),
            activity: activity_sql(t, "").into(),
            activity_in: activity_sql(
                t,
                r#"
             AND ("Queue" IN (SELECT value FROM json_each(?1)) OR "Queue" IS NULL)"#,
            )
            .into(),
            unusable_ids_exist: UNUSABLE_IDS_EXIST.replace("{t}", t).into(),
            unusable_ids_dead: UNUSABLE_IDS_DEAD
                .replace("{t}", t)
                .replace("{NOW}", NOW)
                .into(),
        }
    }
}

fn pending_by_key_sql(t: &str) -> String {
    format!(
        r#"SELECT "Id" FROM {t} WHERE "UniqueKey" = ?1 AND "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#
    )
}

/// A SQLite date modifier moving "now" by `seconds` (which may be negative).
pub(crate) fn offset(seconds: f64) -> String {
    format!("{seconds:+.3} seconds")
}

/// Inserts `command` through `conn` — a pooled connection or, with `&mut *tx`, the
/// caller's open transaction, so the command commits or rolls back with it. With a
/// unique key whose pending row exists (committed, or inserted earlier in the same
/// transaction), inserts nothing and returns that row's id (`existing: true`).
pub async fn insert_command(
    conn: &mut SqliteConnection,
    table: &TableName,
    command: &NewCommand,
) -> Result<Scheduled> {
    command.validate()?;
    let t = table.quoted(Engine::Sqlite);
    let version = if command.uses_v2_columns() {
        table_version(conn, table).await?
    } else {
        1
    };
    let sql: Arc<str> = insert_sql(&t).into();
    let by_key: Arc<str> = pending_by_key_sql(&t).into();
    insert_one(conn, &sql, &by_key, &t, table, command, version).await
}

/// Inserts `commands` (validated, of a table of schema `version`) through `conn`, which
/// is inside a transaction: runs of commands without a unique key in multi-row
/// statements of [`INSERT_ROWS_PER_STATEMENT`] rows (well within SQLite's 32,766 bound
/// variables), each with a key on its own (it may meet a pending row, or one earlier in
/// the batch). One [`Scheduled`] per command, in order.
async fn insert_many(
    conn: &mut SqliteConnection,
    v1: &Arc<str>,
    by_key: &Arc<str>,
    t: &str,
    table: &TableName,
    commands: &[NewCommand],
    version: u32,
) -> Result<Vec<Scheduled>> {
    let v2 = version >= 2 && commands.iter().any(NewCommand::uses_v2_columns);
    // Only a batch that sets a key names the version-4 columns.
    let v4 = v2 && commands.iter().any(|c| c.needs_v4().is_some());
    let mut scheduled = Vec::with_capacity(commands.len());
    if !v2 {
        let mut full: Option<Arc<str>> = None;
        for chunk in commands.chunks(INSERT_ROWS_PER_STATEMENT) {
            let sql = if chunk.len() == INSERT_ROWS_PER_STATEMENT {
                full.get_or_insert_with(|| multi_row_insert(t, chunk.len()))
                    .clone()
            } else {
                multi_row_insert(t, chunk.len())
            };
            insert_rows(&mut *conn, &sql, table, chunk, false, false).await?;
        }
        scheduled.extend(commands.iter().map(|c| Scheduled::new(c.id.clone())));
    } else {
        // Runs of commands without a unique key go in multi-row statements; each with
        // one on its own (it may meet a pending row, or one earlier in the batch).
        let mut rest = commands;
        while !rest.is_empty() {
            if rest[0].unique_key.is_some() {
                let command = &rest[0];
                scheduled
                    .push(insert_one(&mut *conn, v1, by_key, t, table, command, version).await?);
                rest = &rest[1..];
                continue;
            }
            let run = rest
                .iter()
                .take(INSERT_ROWS_PER_STATEMENT)
                .take_while(|c| c.unique_key.is_none())
                .count();
            let (chunk, after) = rest.split_at(run);
            let sql = insert_v2_sql(t, chunk.len(), false, v4);
            insert_rows(&mut *conn, &sql, table, chunk, true, v4).await?;
            scheduled.extend(chunk.iter().map(|c| Scheduled::new(c.id.clone())));
            rest = after;
        }
    }
    Ok(scheduled)
}

/// Inserts `commands` through `conn` — a pooled connection or, with `&mut *tx`, the
/// caller's open transaction — in bulk ([`insert_many`]), inside a savepoint of its own,
/// so a failure leaves none of them and the caller's transaction usable.
pub async fn insert_commands(
    conn: &mut SqliteConnection,
    table: &TableName,
    commands: &[NewCommand],
) -> Result<Vec<Scheduled>> {
    super::validate_batch(commands)?;
    if commands.is_empty() {
        return Ok(Vec::new());
    }
    let t = table.quoted(Engine::Sqlite);
    let version = super::batch_version(commands, table_version(conn, table)).await?;
    super::refuse_newer_asks(table, version, commands.iter())?;
    let v1: Arc<str> = insert_sql(&t).into();
    let by_key: Arc<str> = pending_by_key_sql(&t).into();
    let context = || format!("scheduling commands in bulk into {table}");
    let mut savepoint = sqlx::Connection::begin(&mut *conn)
        .await
        .map_err(Error::db(context()))?;
    let scheduled = insert_many(&mut savepoint, &v1, &by_key, &t, table, commands, version).await?;
    savepoint.commit().await.map_err(Error::db(context()))?;
    Ok(scheduled)
}

/// The schema version of `table` as `conn` sees it.
async fn table_version(conn: &mut SqliteConnection, table: &TableName) -> Result<u32> {
    let (queue, order_key): (i64, i64) = sqlx::query_as(
        "SELECT COALESCE(SUM(name = 'Queue'), 0), COALESCE(SUM(name = 'OrderKey'), 0) \
         FROM pragma_table_info(?, ?)",
    )
    .bind(table.name())
    .bind(table.schema().unwrap_or("main"))
    .fetch_one(&mut *conn)
    .await
    .map_err(Error::db(format!(
        "looking up the schema version of {table}"
    )))?;
    // Version 3 (the history table) changes nothing an insert writes: it reads as 2.
    Ok(match (queue > 0, order_key > 0) {
        (true, true) => 4,
        (true, false) => 2,
        (false, _) => 1,
    })
}

/// Inserts one command: the version-1 statement `v1` when it names no version-2 column,
/// else the version-2 one, which with a unique key returns the pending row holding it
/// (read with `by_key`) instead of inserting.
async fn insert_one(
    conn: &mut SqliteConnection,
    v1: &Arc<str>,
    by_key: &Arc<str>,
    t: &str,
    table: &TableName,
    command: &NewCommand,
    version: u32,
) -> Result<Scheduled> {
    command.validate()?;
    super::refuse_newer_asks(table, version, std::iter::once(command))?;
    if version < 2 || !command.uses_v2_columns() {
        insert_rows(conn, v1, table, std::slice::from_ref(command), false, false).await?;
        return Ok(Scheduled::new(command.id.clone()));
    }
    let v4 = command.needs_v4().is_some();
    let Some(key) = &command.unique_key else {
        let sql = insert_v2_sql(t, 1, false, v4);
        insert_rows(conn, &sql, table, std::slice::from_ref(command), true, v4).await?;
        return Ok(Scheduled::new(command.id.clone()));
    };
    let sql = insert_v2_sql(t, 1, true, v4);
    let context = || format!("scheduling a command into {table}");
    // One writer at a time: the row that holds the key cannot settle between the insert
    // and the read inside a transaction; outside one it can, so try again.
    for _ in 0..super::UNIQUE_KEY_TRIES {
        let inserted = bind_row(sqlx::query(AssertSqlSafe(sql.clone())), command, true, v4)
            .fetch_optional(&mut *conn)
            .await
            .map_err(Error::db(context()))?;
        if inserted.is_some() {
            return Ok(Scheduled::new(command.id.clone()));
        }
        let existing: Option<String> = sqlx::query_scalar(AssertSqlSafe(by_key.clone()))
            .bind(key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(Error::db(context()))?;
        if let Some(existing) = existing {
            return Ok(Scheduled {
                id: CommandId::stored(existing),
                existing: true,
            });
        }
    }
    Err(super::unique_key_unsettled(table, key))
}

type SqliteQuery<'q> = sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>;

/// Binds one row of an insert (thirteen parameters with `v2`, fifteen with `v4` too, else
/// nine).
fn bind_row<'q>(
    query: SqliteQuery<'q>,
    command: &NewCommand,
    v2: bool,
    v4: bool,
) -> SqliteQuery<'q> {
    let (at, delay) = match command.run_at {
        RunAt::Now => (None, 0.0),
        RunAt::At(at) => (Some(format_timestamp(at)), 0.0),
        RunAt::After(delay) => (None, delay.as_secs_f64()),
    };
    let ctx = &command.context;
    let query = query
        .bind(command.id.to_string())
        .bind(command.type_name.clone())
        .bind(command.payload.to_string())
        .bind(at)
        .bind(offset(delay))
        .bind(ctx.user_id.clone())
        .bind(ctx.roles_json())
        .bind(ctx.tenant_id.clone())
        .bind(ctx.correlation_id.clone());
    if !v2 {
        return query;
    }
    let query = query
        .bind(command.queue.clone())
        .bind(i64::from(command.priority))
        .bind(command.unique_key.clone())
        .bind(command.trace_parent_to_store());
    if !v4 {
        return query;
    }
    query
        .bind(command.order_key.clone())
        .bind(command.concurrency_key.clone())
}

/// Inserts `commands` with one multi-row statement (`sql` has one row per command, of
/// the version-2 columns with `v2`, and the keys with `v4`).
async fn insert_rows(
    conn: &mut SqliteConnection,
    sql: &Arc<str>,
    table: &TableName,
    commands: &[NewCommand],
    v2: bool,
    v4: bool,
) -> Result<()> {
    let mut query = sqlx::query(AssertSqlSafe(sql.clone()));
    for command in commands {
        command.validate()?;
        query = bind_row(query, command, v2, v4);
    }
    query
        .execute(conn)
        .await
        .map_err(Error::db(format!("scheduling commands into {table}")))?;
    Ok(())
}

/// Decodes a stored time: icq's text, another program's text, or integer Unix time.
fn time(row: &SqliteRow, column: &str) -> std::result::Result<Option<DateTime<Utc>>, String> {
    let raw = row.try_get_raw(column).map_err(|e| e.to_string())?;
    if raw.is_null() {
        return Ok(None);
    }
    let text = match row.try_get::<String, _>(column) {
        Ok(text) => text,
        Err(_) => match row.try_get::<f64, _>(column) {
            Ok(seconds) => seconds.to_string(),
            Err(err) => return Err(err.to_string()),
        },
    };
    parse_timestamp(&text)
        .map(Some)
        .ok_or_else(|| format!("`{text}` is not a UTC timestamp"))
}

fn optional_time(d: &mut Decoder, row: &SqliteRow, column: &str) -> Option<DateTime<Utc>> {
    d.take(column, time(row, column)).flatten()
}

fn required_time(d: &mut Decoder, row: &SqliteRow, column: &str) -> DateTime<Utc> {
    match d.take(column, time(row, column)) {
        Some(Some(at)) => at,
        Some(None) => {
            d.defect(column, "NULL");
            DateTime::<Utc>::UNIX_EPOCH
        }
        None => DateTime::<Utc>::UNIX_EPOCH,
    }
}

/// The row's `Id` as stored; a BLOB another program wrote, or text that is not valid
/// UTF-8, is shown as `X'…'` and is a defect (the claim skips BLOBs and dead-letters
/// them by their key; invalid text it dead-letters by its bytes, [`UNREADABLE_ID_DEAD`]).
/// A NULL id is shown as `NULL`.
fn stored_id(d: &mut Decoder, row: &SqliteRow) -> std::result::Result<CommandId, sqlx::Error> {
    text_id(row).or_else(|err| {
        if row.try_get_raw("Id").is_ok_and(|raw| raw.is_null()) {
            d.defect("Id", "NULL");
            return Ok(CommandId::stored("NULL".to_owned()));
        }
        match row.try_get::<Vec<u8>, _>("Id") {
            Ok(bytes) => {
                let hex: String = bytes.iter().take(64).map(|b| format!("{b:02X}")).collect();
                let text = row
                    .try_get_raw("Id")
                    .is_ok_and(|raw| sqlx::TypeInfo::name(&*raw.type_info()) == "TEXT");
                d.defect(
                    "Id",
                    if text {
                        "text that is not valid UTF-8 (ids are UTF-8 text)"
                    } else {
                        "a BLOB, not text"
                    },
                );
                Ok(CommandId::stored(format!("X'{hex}'")))
            }
            Err(_) => Err(err),
        }
    })
}

/// Dead-letters the claimed row whose `Id` is text that is not valid UTF-8, by its bytes
/// (`?1`, a BLOB cast back to text: the same bytes, so the primary key finds it) and the
/// claim's token (`?2`), with `?3` as the reason. Such a row cannot be named by the
/// stamps, which carry ids as UTF-8 JSON text.
const UNREADABLE_ID_DEAD: &str = r#"UPDATE {t}
    SET "DeadLetteredAt" = {NOW}, "LockToken" = NULL, "LockedUntil" = NULL, "LastError" = ?3
    WHERE "Id" = CAST(?1 AS TEXT) AND "LockToken" = ?2"#;

/// The payload's size in bytes as the row holds it (its text), for the producer's
/// buffered-bytes budget; 0 when it is not text.
pub(crate) fn payload_bytes(row: &SqliteRow) -> usize {
    row.try_get_unchecked::<&str, _>("Payload")
        .map_or(0, str::len)
}

/// Decodes a full row (`SELECT *` or `RETURNING *`) column by column; only an unreadable
/// `Id` fails it (the row could not be stamped anyway).
pub(crate) fn decode_row(row: &SqliteRow) -> std::result::Result<CommandRow, sqlx::Error> {
    let mut d = Decoder::default();
    let mut out = CommandRow::placeholder(stored_id(&mut d, row)?);
    // Borrowed: the payload's text is parsed where the row holds it, never copied first.
    let payload = d.get::<_, &str>(row, "Payload");
    out.payload = d.json_str("Payload", payload);
    text_columns(&mut d, row, &mut out);
    out.created_at = required_time(&mut d, row, "CreatedAt");
    out.run_at = required_time(&mut d, row, "RunAt");
    out.attempts = super::decode::attempts(&mut d, row);
    out.lock_token = text_token(d.get::<_, Option<String>>(row, "LockToken").flatten());
    out.locked_until = optional_time(&mut d, row, "LockedUntil");
    out.processed_at = optional_time(&mut d, row, "ProcessedAt");
    out.dead_lettered_at = optional_time(&mut d, row, "DeadLetteredAt");
    super::decode::v2_columns(&mut d, row, &mut out);
    Ok(d.finish(out))
}

/// The outcomes as the set-state statement's JSON array.
fn stamps_json(changes: &[SetState]) -> String {
    leases_json(changes.iter().map(|c| {
        (
            &c.lease,
            c.kind(),
            c.delay_seconds().map(offset),
            c.error(),
            c.errors(),
        )
    }))
}

/// Marks a connection that runs a statement string opening and committing its own
/// transaction (see [`SqliteDriver::claim_on`]): unless the string ran to its end or what
/// it left open was rolled back ([`OwnTransaction::ended`]; its future was dropped
/// mid-way, or the rollback failed), the connection is closed when dropped, which rolls
/// back whatever the string left open, instead of going back to the pool inside a
/// transaction.
struct OwnTransaction<'c> {
    conn: &'c mut Warm<Sqlite>,
    ended: bool,
}

impl OwnTransaction<'_> {
    /// The connection is outside any transaction again.
    fn ended(mut self) {
        self.ended = true;
    }
}

impl Drop for OwnTransaction<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.conn.close_on_drop();
        }
    }
}

/// The JSON array of `[id, token, kind, delay, error, errors]` the set-state and extend
/// statements read with `json_each` (`errors`: a failure's new `Errors`).
fn leases_json<'a>(
    rows: impl Iterator<
        Item = (
            &'a Lease,
            i16,
            Option<String>,
            Option<String>,
            Option<&'a str>,
        ),
    >,
) -> String {
    let rows: Vec<serde_json::Value> = rows
        .map(|(lease, kind, delay, error, errors)| {
            serde_json::json!([
                lease.id.as_str(),
                lease.token.to_string(),
                kind,
                delay,
                error,
                errors
            ])
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

/// The results sqlx's worker thread may send ahead of the task reading them, on icq's own
/// connections: a whole claim of the largest batch, and the stamp-and-claim string's four
/// statement results. At sqlx's default (50) a full claim of the default batch (50) with
/// its stamps made the worker wait for the task with the write lock held, before its
/// `COMMIT`. The channel grows only as far as it is filled.
const ROW_CHANNEL: usize = crate::settings::BATCH_SIZE_MAX as usize + 4;

/// How icq's own connections commit unless the processor writes on them: a commit is
/// synced to disk before it returns.
const DURABLE_SYNCHRONOUS: &str = "PRAGMA synchronous = FULL";

/// How the processor's own writes commit on icq's own connections: synced at the next
/// checkpoint, so a power loss may undo the last claims and stamps (their commands run
/// again) but never a schedule.
const WORK_SYNCHRONOUS: &str = "PRAGMA synchronous = NORMAL";

/// The size, in bytes, the WAL file is cut back to once a checkpoint restarts it.
const WAL_SIZE_LIMIT: &str = "16777216";

/// How long icq's own connections wait for SQLite's write lock before a statement fails
/// with "database is locked".
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

impl SqliteDriver {
    /// The table's columns, named: a `SELECT *` prepared before an upgrade keeps its
    /// column count in sqlx's statement cache and reads past the new columns.
    pub(super) async fn columns(&self) -> Result<&'static str> {
        let version = self.schema_version().await?;
        Ok(if version >= 4 {
            COLUMNS_V4
        } else if version >= 2 {
            COLUMNS_V2
        } else {
            COLUMNS_V1
        })
    }

    /// The processor's turn to write (see `writing`) and a connection to write on; the
    /// turn ends when the guard drops. On icq's own pool the connection commits with
    /// `synchronous = NORMAL` (see [`SqliteDriver::connect`]); the application's pool is
    /// left as configured.
    async fn write_turn(
        &self,
        what: &str,
    ) -> Result<(tokio::sync::MutexGuard<'_, ()>, Warm<Sqlite>)> {
        let turn = self.writing.lock().await;
        Ok((turn, self.work_connection(what).await?))
    }

    /// A connection to write on without waiting for the processor's turn: for lease
    /// renewals, which must not queue behind claims and stamps that wait out another
    /// program's hold on the write lock (leases would lapse under running commands). A
    /// renewal waits in SQLite's busy handler instead, a poll of at most 100 ms, once per
    /// third of the lease.
    async fn work_connection(&self, what: &str) -> Result<Warm<Sqlite>> {
        let mut conn = self
            .warm
            .take(&self.pool)
            .await
            .map_err(Error::db(self.ctx(what)))?;
        if !self.shared_pool && conn.set_up_for_work() {
            sqlx::query(WORK_SYNCHRONOUS)
                .execute(&mut *conn)
                .await
                .map_err(Error::db(self.ctx(what)))?;
        }
        Ok(conn)
    }

    /// Opens a pool on `url` for `table`: WAL journal, a generous busy timeout, and
    /// `synchronous = FULL` on every connection it hands out, so that a schedule, a
    /// requeue, a replay or any other write through the pool is on disk when its commit
    /// returns (in WAL mode `NORMAL` syncs only at a checkpoint, which a power loss can
    /// beat). Only the processor's own writes ([`SqliteDriver::work_connection`]: claims,
    /// stamps, lease renewals) switch their connection to `NORMAL`: losing the last of
    /// those only makes a command run again. A connection goes back to `FULL` before the
    /// pool hands it out again.
    pub async fn connect(url: &str, table: &TableName, options: &ConnectOptions) -> Result<Self> {
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(Error::db(format!("parsing {}", redact_url(url))))?
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            // A reader that stays open (a long read, a stuck process) keeps checkpoints
            // from restarting the WAL, which then grows with every write; afterwards the
            // file is cut back to this size instead of keeping its high-water mark.
            .pragma("journal_size_limit", WAL_SIZE_LIMIT)
            .busy_timeout(BUSY_TIMEOUT)
            .row_buffer_size(ROW_CHANNEL);
        let pool = options
            .pool::<sqlx::Sqlite>()
            .max_connections(options.max_connections.clamp(1, 8))
            // A failure closes the connection and the pool opens another (`FULL` too).
            .before_acquire(|conn, _meta| {
                Box::pin(async move {
                    sqlx::query(DURABLE_SYNCHRONOUS).execute(&mut *conn).await?;
                    Ok(true)
                })
            });
        // Switching a fresh file to WAL while another process opens it returns
        // SQLITE_BUSY without waiting on the busy timeout (two workers started together):
        // try again for a few seconds rather than fail the start.
        let mut tries = 0;
        let pool = loop {
            match pool.clone().connect_with(connect.clone()).await {
                Err(err) if tries < 50 && err.to_string().contains("database is locked") => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => break other.map_err(Error::db(format!("opening {}", redact_url(url))))?,
            }
        };
        Self::on_pool(pool, table, false).await
    }

    /// A driver on the application's own pool, for `table`, as it is configured: icq's
    /// own connect sets WAL, `synchronous = FULL` (`NORMAL` for the processor's writes), a
    /// 30 s busy timeout and a row buffer of a whole claim (`row_buffer_size`,
    /// [`ROW_CHANNEL`]; at sqlx's default of 50 a stamp-and-claim of more than 46 rows
    /// holds the write lock until the processor reads them), which the application's
    /// options should set too. Every statement here commits as durably as the pool's
    /// `synchronous` says (SQLite's default is `FULL`; with WAL and `NORMAL` a power loss
    /// can undo the last schedules, as it can the application's own writes). Closing the
    /// driver leaves `pool` open.
    pub(crate) async fn from_pool(pool: SqlitePool, table: &TableName) -> Result<Self> {
        Self::on_pool(pool, table, true).await
    }

    /// The driver on `pool`, once `table`'s schema is found to exist.
    async fn on_pool(pool: SqlitePool, table: &TableName, shared_pool: bool) -> Result<Self> {
        if let Some(schema) = table.schema() {
            // SQLite's schemas are the connection's attached databases (`main`, `temp`):
            // any other schema is missing, which is not the same as a missing table.
            let found: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM pragma_database_list WHERE name = ?")
                    .bind(schema)
                    .fetch_one(&pool)
                    .await
                    .map_err(Error::db(format!("looking up the schema of {table}")))?;
            if found == 0 && !schema.eq_ignore_ascii_case("temp") {
                if !shared_pool {
                    pool.close().await;
                }
                return Err(Error::schema_missing(table, Engine::Sqlite));
            }
        }
        let (t, h) = (
            table.quoted(Engine::Sqlite),
            table.history().quoted(Engine::Sqlite),
        );
        Ok(SqliteDriver {
            pool,
            table: table.clone(),
            sql: Sql::new(&t, &h),
            t,
            h,
            missorted_scanned_at: std::sync::Mutex::new(None),
            version: Default::default(),
            unusable: Default::default(),
            warm: warm::WarmConnections::new(shared_pool),
            writing: Default::default(),
            row_key: Default::default(),
            shared_pool,
            unusable_ids: Default::default(),
        })
    }

    fn ctx(&self, what: &str) -> String {
        format!("{what} ({})", self.table)
    }

    /// Dead-letters pending rows whose `Id` is not text. A read first, so that the usual
    /// case (there are none) takes no write lock; outside the claim's transaction, which
    /// must not upgrade a read to a write. At most once per [`super::UNUSABLE_EVERY`]
    /// (at once when a processor starts), not before every claim: a claim that meets a
    /// non-text id dead-letters it by its bytes itself, and a NULL id, which no claim
    /// can lease, settles within that period.
    async fn dead_letter_unusable_ids(&self) -> Result<()> {
        if !self.unusable_ids.due() {
            return Ok(());
        }
        let ctx = || self.ctx("looking for rows whose Id is not text");
        let found: bool = sqlx::query_scalar(AssertSqlSafe(self.sql.unusable_ids_exist.clone()))
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(ctx()))?;
        if found {
            let done = sqlx::query(AssertSqlSafe(self.sql.unusable_ids_dead.clone()))
                .execute(&self.pool)
                .await
                .map_err(Error::db(ctx()))?;
            if done.rows_affected() > 0 {
                tracing::warn!(table = %self.table, rows = done.rows_affected(), "dead-lettered rows whose Id is not text");
            }
        }
        Ok(())
    }

    /// Runs [`MISSORTED_RUN_AT_DEAD`] when it has not run for half a lease period, so such
    /// a row settles within one lease (and at once when a processor starts).
    async fn dead_letter_missorted_run_at(&self, lease: Duration) -> Result<()> {
        {
            let mut at = self
                .missorted_scanned_at
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if at.is_some_and(|at| at.elapsed() < lease / 2) {
                return Ok(());
            }
            *at = Some(std::time::Instant::now());
        }
        let sql = MISSORTED_RUN_AT_DEAD
            .replace("{t}", &self.t)
            .replace("{NOW}", NOW);
        let done = sqlx::query(AssertSqlSafe(sql))
            .execute(&self.pool)
            .await
            .map_err(Error::db(
                self.ctx("looking for RunAt text that is not a time"),
            ))?;
        if done.rows_affected() > 0 {
            tracing::warn!(table = %self.table, rows = done.rows_affected(), "dead-lettered rows whose RunAt is text that is not a time");
        }
        Ok(())
    }

    /// How a claim names the rows it picks: by `rowid`, which the poll index's entries
    /// carry, so the claim updates the rows it found without looking each up again by
    /// `"Id"` in the primary key's index (50,000 no-op: one replica and four each drained
    /// 7% faster); by `"Id"` on a table without one (`WITHOUT ROWID`) or whose columns
    /// take every name of it (`rowid`, `_rowid_`, `oid`). Looked up once per table.
    async fn row_key(&self) -> Result<&'static str> {
        let known = *self
            .row_key
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(key) = known {
            return Ok(key);
        }
        let ctx = || self.ctx("looking up how the table's rows are named");
        let schema = self.table.schema().unwrap_or("main");
        let columns: Vec<String> =
            sqlx::query_scalar("SELECT lower(name) FROM pragma_table_xinfo(?, ?)")
                .bind(self.table.name())
                .bind(schema)
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db(ctx()))?;
        let mut key = r#""Id""#;
        if let Some(alias) = ["rowid", "_rowid_", "oid"]
            .into_iter()
            .find(|alias| !columns.iter().any(|c| c == alias))
        {
            // A WITHOUT ROWID table refuses the name ("no such column").
            let probe = format!("SELECT {alias} FROM {} WHERE 0", self.t);
            if sqlx::query(AssertSqlSafe(probe))
                .execute(&self.pool)
                .await
                .is_ok()
            {
                key = alias;
            }
        }
        *self
            .row_key
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(key);
        Ok(key)
    }

    /// Claims; with `stamps`, first stamps those outcomes in the same transaction and
    /// never claims their rows (says how many were stamped).
    ///
    /// Stamps and claim are one statement string (`BEGIN IMMEDIATE; stamp; claim;
    /// COMMIT`) and so one call to sqlx's worker thread: the write lock is held only while
    /// SQLite runs, never across the hand-offs between that thread and this task (three of
    /// them with one call per statement, each as long as the scheduler makes it — with
    /// several replicas on two cores, the lock waited for a descheduled process), nor
    /// across a wait for this task to take the rows (the row channel of icq's own
    /// connections holds a whole claim, [`ROW_CHANNEL`]). A string that fails before its
    /// `COMMIT` is rolled back here; one whose future is dropped mid-way leaves the
    /// connection inside the transaction, and it is closed ([`OwnTransaction`]).
    async fn claim_on(
        &self,
        conn: &mut Warm<Sqlite>,
        params: &ClaimParams,
        stamps: Option<&[SetState]>,
    ) -> Result<(u64, Vec<ClaimedRow>)> {
        let version = self.schema_version().await?;
        super::check_queues(version, &self.table, params.queues.as_deref())?;
        let v2 = version >= 2;
        let stamps = stamps.filter(|changes| !changes.is_empty());
        let key = ClaimKey {
            v2,
            history: version >= 3,
            v4: version >= 4,
            types: params.types.is_some(),
            queues: super::QueueFilter::of(params.queues.as_deref()),
            unusable: !v2 || self.unusable.due(),
            stamps: stamps.is_some(),
            row: self.row_key().await?,
            paused: params.skip_paused && version >= 4,
        };
        let sql = self
            .sql
            .claims
            .get(key, |key| claim_sql(&self.t, &self.h, key));
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(params.token.to_string())
            .bind(offset(params.lease.as_secs_f64()))
            .bind(offset(-params.processing_delay.as_secs_f64()))
            .bind(i64::from(params.limit));
        if let Some(types) = &params.types {
            query = query.bind(serde_json::to_string(&types[..]).unwrap_or_default());
        }
        match params.queues.as_deref() {
            None => {}
            Some([queue]) => query = query.bind(queue.clone()),
            Some(queues) => {
                query = query.bind(serde_json::to_string(queues).unwrap_or_default());
            }
        }
        if let Some(changes) = stamps {
            let ids: Vec<&str> = changes.iter().map(|c| c.lease.id.as_str()).collect();
            query = query.bind(serde_json::to_string(&ids).unwrap_or_else(|_| "[]".into()));
        }
        let started = std::time::Instant::now();
        let (stamped, rows) = match stamps {
            None => {
                let rows = query
                    .fetch_all(&mut **conn)
                    .await
                    .map_err(Error::db(self.ctx("claiming due commands")))?;
                (0, rows)
            }
            Some(changes) => {
                let query = query.bind(stamps_json(changes));
                let ctx = || self.ctx("stamping outcomes and claiming due commands");
                let own = OwnTransaction {
                    conn: &mut *conn,
                    ended: false,
                };
                // One result per statement, in order: BEGIN, the stamp, (on version 3 the
                // move to history,) the claim (after its rows), COMMIT.
                let statements = stamp_claim_statements(key.history);
                let (mut results, mut stamped, mut rows) = (0, 0, Vec::new());
                let mut steps = (&mut **own.conn).fetch_many(query);
                let ran = loop {
                    match steps.try_next().await {
                        Ok(Some(Either::Left(done))) => {
                            if results == 1 {
                                stamped = done.rows_affected();
                            }
                            results += 1;
                        }
                        Ok(Some(Either::Right(row))) => rows.push(row),
                        Ok(None) if results == statements => break Ok(()),
                        Ok(None) => {
                            break Err(sqlx::Error::Protocol(format!(
                                "the statement string ran {results} of its {statements} statements"
                            )));
                        }
                        Err(err) => break Err(err),
                    }
                };
                drop(steps);
                if let Err(err) = ran {
                    // A failed BEGIN opened nothing; otherwise roll back what the string
                    // left open (a connection that cannot is closed instead).
                    let rolled_back = results == 0
                        || sqlx::raw_sql(AssertSqlSafe("ROLLBACK"))
                            .execute(&mut **own.conn)
                            .await
                            .is_ok();
                    if rolled_back {
                        own.ended();
                    }
                    return Err(Error::db(ctx())(err));
                }
                own.ended();
                (stamped, rows)
            }
        };
        if key.unusable {
            self.unusable.took(started.elapsed());
        }
        // The statement's own "now": the due-ness of a row claimed for a `RunAt` that only
        // sorts as due is decided on the database's clock, never the worker's.
        let now = rows
            .first()
            .and_then(|row| row.try_get::<String, _>("IcqNow").ok())
            .and_then(|text| parse_timestamp(&text));
        // After the commit: the stamps and the claim stand whatever happens here, so a
        // failure is logged (the rows it meant stay leased to this claim and are
        // dropped below: their leases lapse) rather than failing the call, which would put
        // the stamped outcomes back to be stamped again (counted as stale).
        let unreadable = match self.dead_letter_unreadable_ids(conn, params, &rows).await {
            Ok(unreadable) => unreadable,
            Err(err) => {
                tracing::warn!(table = %self.table, error = %err, "could not dead-letter claimed rows whose Id is not UTF-8; their leases will lapse");
                true
            }
        };
        // Consumed in order: each raw row is dropped once decoded, so a claim of large
        // payloads never holds every raw row and every decoded one at once.
        let mut claimed = super::leased_rows(
            &self.table,
            params.token,
            rows.into_iter()
                .map(|row| (decode_row(&row), payload_bytes(&row))),
        );
        if unreadable {
            claimed.retain(|c| !c.row.defects.iter().any(|d| d.starts_with("column Id:")));
        }
        if let Some(now) = now {
            for row in &mut claimed {
                if row.row.run_at > now {
                    row.not_due_for = (row.row.run_at - now).to_std().ok();
                }
            }
        }
        Ok((stamped, claimed))
    }

    /// Settles, within the claim, the claimed rows whose `Id` is text that is not valid
    /// UTF-8 (no stamp could name them, so each would otherwise be claimed again every
    /// lease, forever); says whether there were any, to drop from the claimed rows.
    async fn dead_letter_unreadable_ids(
        &self,
        conn: &mut SqliteConnection,
        params: &ClaimParams,
        rows: &[SqliteRow],
    ) -> Result<bool> {
        let unreadable: Vec<Vec<u8>> = rows
            .iter()
            .filter(|row| row.try_get::<String, _>("Id").is_err())
            .filter_map(|row| row.try_get::<Vec<u8>, _>("Id").ok())
            .collect();
        if unreadable.is_empty() {
            return Ok(false);
        }
        let sql = UNREADABLE_ID_DEAD
            .replace("{t}", &self.t)
            .replace("{NOW}", NOW);
        for bytes in unreadable {
            let hex: String = bytes.iter().take(64).map(|b| format!("{b:02X}")).collect();
            let reason = format!(
                "row cannot be processed: column Id: text that is not valid UTF-8 (X'{hex}'), so \
                 no stamp can name it; ids are UTF-8 text"
            );
            tracing::warn!(table = %self.table, id = %format!("X'{hex}'"), "command dead-lettered: its Id is not valid UTF-8");
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(bytes)
                .bind(params.token.to_string())
                .bind(reason)
                .execute(&mut *conn)
                .await
                .map_err(Error::db(
                    self.ctx("dead-lettering a row whose Id is not UTF-8"),
                ))?;
        }
        Ok(true)
    }

    async fn set_state_on(&self, conn: &mut SqliteConnection, changes: &[SetState]) -> Result<u64> {
        if changes.is_empty() {
            return Ok(0);
        }
        let version = self.schema_version().await?;
        let ctx = || self.ctx("stamping outcomes");
        if version < 3 {
            let sql = if version >= 2 {
                &self.sql.set_state_v2
            } else {
                &self.sql.set_state_v1
            };
            let done = sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(stamps_json(changes))
                .execute(&mut *conn)
                .await
                .map_err(Error::db(ctx()))?;
            return Ok(done.rows_affected());
        }
        let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE")
            .await
            .map_err(Error::db(ctx()))?;
        let done = self.stamp_moving_on(&mut tx, changes, version).await?;
        tx.commit().await.map_err(Error::db(ctx()))?;
        Ok(done)
    }

    /// The stamps of a version-3 (or later) table on `conn`, inside a transaction the
    /// caller opened: the set-state statement (on version 4 with the attempts' errors),
    /// then the move of the rows it completed to history. Returns how many rows were
    /// stamped.
    pub(crate) async fn stamp_moving_on(
        &self,
        conn: &mut SqliteConnection,
        changes: &[SetState],
        version: u32,
    ) -> Result<u64> {
        let json = stamps_json(changes);
        let ctx = || self.ctx("stamping outcomes");
        let sql = if version >= 4 {
            &self.sql.set_state_v4
        } else {
            &self.sql.set_state_v2
        };
        let done = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(json.clone())
            .execute(&mut *conn)
            .await
            .map_err(Error::db(ctx()))?;
        for statement in &self.sql.move_completed[usize::from(version >= 4)] {
            sqlx::query(AssertSqlSafe(statement.clone()))
                .bind(json.clone())
                .execute(&mut *conn)
                .await
                .map_err(Error::db(ctx()))?;
        }
        Ok(done.rows_affected())
    }
}

#[async_trait]
impl QueueOps for SqliteDriver {
    async fn command_insert(&self, params: &CommandInsertParams<'_>) -> Result<Scheduled> {
        let command = params.command;
        let version = if command.uses_v2_columns() {
            self.schema_version().await?
        } else {
            1
        };
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(Error::db(self.ctx("scheduling a command")))?;
        insert_one(
            &mut conn,
            &self.sql.insert,
            &self.sql.pending_by_key,
            &self.t,
            &self.table,
            command,
            version,
        )
        .await
    }

    async fn command_insert_many(
        &self,
        params: &CommandInsertManyParams<'_>,
    ) -> Result<Vec<Scheduled>> {
        let commands = params.commands;
        super::validate_batch(commands)?;
        if commands.is_empty() {
            return Ok(Vec::new());
        }
        let version = super::batch_version(commands, self.schema_version()).await?;
        super::refuse_newer_asks(&self.table, version, commands.iter())?;
        let ctx = || self.ctx("scheduling commands in bulk");
        let mut tx = self.pool.begin().await.map_err(Error::db(ctx()))?;
        let scheduled = insert_many(
            &mut tx,
            &self.sql.insert,
            &self.sql.pending_by_key,
            &self.t,
            &self.table,
            commands,
            version,
        )
        .await?;
        tx.commit().await.map_err(Error::db(ctx()))?;
        Ok(scheduled)
    }

    async fn command_claim(&self, params: &ClaimParams) -> Result<Vec<ClaimedRow>> {
        self.dead_letter_unusable_ids().await?;
        self.dead_letter_missorted_run_at(params.lease).await?;
        self.schema_version().await?;
        self.row_key().await?;
        let (_turn, mut conn) = self.write_turn("claiming due commands").await?;
        let (_, claimed) = self.claim_on(&mut conn, params, None).await?;
        self.warm.keep(conn, &self.pool);
        Ok(claimed)
    }

    async fn command_set_state_and_claim(
        &self,
        params: &CommandSetStateAndClaimParams<'_>,
    ) -> Result<(u64, Vec<ClaimedRow>)> {
        let (changes, params) = (params.changes, params.claim);
        self.dead_letter_unusable_ids().await?;
        self.dead_letter_missorted_run_at(params.lease).await?;
        // Looked up (and remembered) before the transaction takes a connection: a pool
        // of one would otherwise wait on itself.
        self.schema_version().await?;
        self.row_key().await?;
        let what = "stamping outcomes and claiming due commands";
        let (_turn, mut conn) = self.write_turn(what).await?;
        let stamped_and_claimed = self.claim_on(&mut conn, params, Some(changes)).await?;
        self.warm.keep(conn, &self.pool);
        Ok(stamped_and_claimed)
    }

    async fn command_claim_limited(
        &self,
        params: &super::LimitedClaimParams<'_>,
    ) -> Result<super::LimitedClaim> {
        self.claim_limited(params).await
    }

    async fn command_get(&self, params: &CommandGetParams<'_>) -> Result<Option<CommandRow>> {
        let id = params.id;
        let sql = format!(
            r#"SELECT {} FROM {} WHERE "Id" = ?"#,
            self.columns().await?,
            self.all_rows().await?
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db(self.ctx("reading a command")))?;
        row.as_ref()
            .map(|r| decode_row(r).map_err(Error::db(self.ctx("decoding a command"))))
            .transpose()
    }

    async fn command_set_state_many(&self, params: &CommandSetStateManyParams<'_>) -> Result<u64> {
        let changes = params.changes;
        self.schema_version().await?;
        let (_turn, mut conn) = self.write_turn("stamping outcomes").await?;
        let stamped = self.set_state_on(&mut conn, changes).await?;
        self.warm.keep(conn, &self.pool);
        Ok(stamped)
    }

    async fn lease_extend_many(&self, params: &LeaseExtendManyParams) -> Result<Vec<Lease>> {
        let (leases, lease) = (params.leases.as_slice(), params.lease);
        let json = leases_json(leases.iter().map(|l| (l, 0, None, None, None)));
        let mut conn = self.work_connection("extending leases").await?;
        let rows = sqlx::query(AssertSqlSafe(self.sql.extend.clone()))
            .bind(json)
            .bind(offset(lease.as_secs_f64()))
            .fetch_all(&mut *conn)
            .await
            .map_err(Error::db(self.ctx("extending leases")))?;
        self.warm.keep(conn, &self.pool);
        Ok(rows
            .iter()
            .filter_map(|row| {
                let id = text_id(row).ok()?;
                let token = text_token(row.try_get("LockToken").ok()?)?;
                Some(Lease { id, token })
            })
            .collect())
    }

    async fn completed_delete_batch(&self, params: &SweepParams) -> Result<Option<u64>> {
        // One writer at a time: SQLite serialises replicas' sweeps by itself.
        let ctx = || self.ctx("deleting old completed commands");
        let older_than = offset(-params.older_than.as_secs_f64());
        let version = self.schema_version().await?;
        if version < 3 {
            let done = sqlx::query(AssertSqlSafe(self.sql.sweep.clone()))
                .bind(older_than)
                .bind(i64::from(params.limit))
                .execute(&self.pool)
                .await
                .map_err(Error::db(ctx()))?;
            return Ok(Some(done.rows_affected()));
        }
        // Completed rows left in the table (by an icq older than version 3 during a
        // rolling upgrade, or by another program) move to history; old history goes.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(Error::db(ctx()))?;
        let mut moved = 0;
        for statement in &self.sql.sweep_move[usize::from(version >= 4)] {
            moved = sqlx::query(AssertSqlSafe(statement.clone()))
                .bind(i64::from(params.limit))
                .execute(&mut *tx)
                .await
                .map_err(Error::db(ctx()))?
                .rows_affected();
        }
        let deleted = sqlx::query(AssertSqlSafe(self.sql.sweep_history.clone()))
            .bind(older_than)
            .bind(i64::from(params.limit))
            .execute(&mut *tx)
            .await
            .map_err(Error::db(ctx()))?;
        tx.commit().await.map_err(Error::db(ctx()))?;
        Ok(Some(moved + deleted.rows_affected()))
    }

    async fn activity(&self) -> Result<Activity> {
        let row = sqlx::query(AssertSqlSafe(self.sql.activity.clone()))
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting due commands")))?;
        super::decode_activity(&row)
    }

    async fn activity_unpaused(&self) -> Result<Activity> {
        if self.schema_version().await? < 4 {
            return self.activity().await;
        }
        let row = sqlx::query(AssertSqlSafe(activity_sql(
            &self.t,
            &paused_filter(&self.t),
        )))
        .fetch_one(&self.pool)
        .await
        .map_err(Error::db(self.ctx("counting due commands")))?;
        super::decode_activity(&row)
    }

    async fn activity_in(&self, queues: Option<&[String]>) -> Result<Activity> {
        let Some(queues) = queues else {
            return self.activity().await;
        };
        super::check_queues(self.schema_version().await?, &self.table, Some(queues))?;
        let row = sqlx::query(AssertSqlSafe(self.sql.activity_in.clone()))
            .bind(serde_json::to_string(queues).unwrap_or_default())
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting due commands")))?;
        super::decode_activity(&row)
    }

    async fn lease_check_many(&self, params: &LeaseCheckManyParams) -> Result<Vec<Lease>> {
        if params.leases.is_empty() {
            return Ok(Vec::new());
        }
        let json = leases_json(params.leases.iter().map(|l| (l, 0, None, None, None)));
        let rows = sqlx::query(AssertSqlSafe(self.sql.check.clone()))
            .bind(json)
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(self.ctx("checking leases")))?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let id = text_id(row).ok()?;
                let token = text_token(row.try_get("LockToken").ok()?)?;
                Some(Lease { id, token })
            })
            .collect())
    }

    async fn lease_others_at_head(&self, params: &LeaseOthersAtHeadParams) -> Result<u64> {
        let order = if self.schema_version().await? >= 2 {
            r#""Priority", "RunAt""#
        } else {
            r#""RunAt""#
        };
        let sql = format!(
            r#"SELECT count(*) AS others FROM (
                   SELECT "LockToken", "LockedUntil" FROM {t}
                   WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL AND "RunAt" <= {now}
                   ORDER BY {order} LIMIT ?1) AS head
               WHERE head."LockedUntil" > {now} AND head."LockedUntil" < ':'
                 AND NOT (head."LockToken" BETWEEN ?2 AND ?3)"#,
            now = NOW,
            t = self.t
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(i64::from(params.window))
            .bind(params.low.to_string())
            .bind(params.high.to_string())
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("looking for other processors' leases")))?;
        super::decode_count(&row, "others")
    }
}

#[async_trait]
impl BenchOps for SqliteDriver {
    async fn bench_fill_completed(&self, params: &BenchFillCompletedParams) -> Result<()> {
        let rows = params.rows;
        if rows == 0 {
            return Ok(());
        }
        let sql = format!(
            r#"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
               INSERT INTO {} ("Type", "Payload", "CreatedAt", "RunAt", "Attempts", "ProcessedAt")
               SELECT 'bench.retained', '{{}}', {NOW}, {NOW}, 1, {NOW} FROM n"#,
            self.t
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(i64::try_from(rows).unwrap_or(i64::MAX))
            .execute(&self.pool)
            .await
            .map_err(Error::db(
                self.ctx("inserting completed rows for the benchmark"),
            ))?;
        Ok(())
    }
}

#[async_trait]
impl Lifecycle for SqliteDriver {
    fn engine(&self) -> Engine {
        Engine::Sqlite
    }

    fn table(&self) -> &TableName {
        &self.table
    }

    async fn table_exists(&self) -> Result<bool> {
        let (schema, name) = (self.table.schema().unwrap_or("main"), self.table.name());
        let master = format!("{}.sqlite_master", Engine::Sqlite.quote_ident(schema));
        let sql = format!("SELECT COUNT(*) FROM {master} WHERE type = 'table' AND name = ?");
        let found: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("looking up the commands table")))?;
        Ok(found > 0)
    }

    async fn schema_version(&self) -> Result<u32> {
        self.version
            .get(async {
                if !self.table_exists().await? {
                    return Ok(None);
                }
                let schema = self.table.schema().unwrap_or("main");
                let master = format!("{}.sqlite_master", Engine::Sqlite.quote_ident(schema));
                let sql = format!(
                    "SELECT (SELECT COUNT(*) FROM pragma_table_info(?1, ?2) WHERE name = 'Queue'), \
                            (SELECT COUNT(*) FROM {master} WHERE type = 'table' AND name = ?3), \
                            (SELECT COUNT(*) FROM pragma_table_info(?1, ?2) WHERE name = 'OrderKey')"
                );
                let (queue, history, order_key): (i64, i64, i64) = sqlx::query_as(AssertSqlSafe(sql))
                    .bind(self.table.name())
                    .bind(schema)
                    .bind(self.table.history().name().to_owned())
                    .fetch_one(&self.pool)
                    .await
                    .map_err(Error::db(self.ctx("looking up the table's schema version")))?;
                Ok(Some(super::version_of(queue > 0, history > 0, order_key > 0)))
            })
            .await
    }

    fn forget_schema_version(&self) {
        self.version.forget();
    }

    async fn schema_apply(&self, ddl: &str) -> Result<()> {
        self.version.forget();
        *self
            .row_key
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        // One transaction, as PostgreSQL runs a script: a replica racing this one sees
        // no table or the whole of it, never a table half-way through its version.
        let ctx = || self.ctx("creating the commands table");
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(Error::db(ctx()))?;
        sqlx::raw_sql(AssertSqlSafe(ddl.to_owned()))
            .execute(&mut *tx)
            .await
            .map_err(Error::db(ctx()))?;
        tx.commit().await.map_err(Error::db(ctx()))
    }

    async fn listen(
        &self,
        _notify: Arc<Notify>,
        _cancelled: Arc<Notify>,
        _queues_changed: Arc<Notify>,
    ) -> Result<bool> {
        Ok(false)
    }

    fn local_lock_wait(&self) -> Option<Duration> {
        Some(BUSY_TIMEOUT)
    }

    fn keep_work_connections(&self, keep: bool) {
        self.warm.set_keeping(keep);
    }

    async fn close(&self) {
        self.warm.clear();
        if !self.shared_pool {
            self.pool.close().await;
        }
    }

    async fn table_drop(&self, down: &str) -> Result<()> {
        self.version.forget();
        super::run_script(&self.pool, down.to_owned(), self.ctx("dropping the table")).await
    }
}

/// A multi-row insert of `rows` rows.
fn multi_row_insert(t: &str, rows: usize) -> Arc<str> {
    format!(
        r#"INSERT INTO {t} ("Id", "Type", "Payload", "RunAt", "UserId", "Roles", "TenantId", "CorrelationId")
           VALUES {}"#,
        vec![INSERT_ROW; rows].join(", ")
    )
    .into()
}

/// Upgrades the embedded default's table from an older schema version to the current
/// one when it finds one (written by an older icq), in one `BEGIN IMMEDIATE` transaction
/// that looks the version up again under the write lock, so two icq processes starting at
/// once upgrade it once. Returns whether it did; a missing table is left to
/// `Queue::ensure_table`, which creates the current version.
pub(crate) async fn upgrade_embedded(
    url: &str,
    table: &TableName,
    upgrade: &(dyn Fn(u32) -> String + Sync),
) -> Result<bool> {
    use sqlx::Connection as _;

    let context = |what: &str| what.to_owned();
    let mut conn = sqlx::SqliteConnection::connect(url)
        .await
        .map_err(Error::db(context("opening the embedded database")))?;
    // The version of an existing table (`None`: missing, created at the current version
    // next). Looked up without a lock first (the usual answer is "current", and a busy
    // worker should not be waited for), then again under the write lock.
    let version = async |conn: &mut sqlx::SqliteConnection| -> Result<Option<u32>> {
        let schema = Engine::Sqlite.quote_ident(table.schema().unwrap_or("main"));
        let sql = format!(
            "SELECT (SELECT COUNT(*) FROM pragma_table_info(?1, ?2)), \
                    (SELECT COUNT(*) FROM pragma_table_info(?1, ?2) WHERE name = 'Queue' COLLATE NOCASE), \
                    (SELECT COUNT(*) FROM {schema}.sqlite_master WHERE type = 'table' AND name = ?3), \
                    (SELECT COUNT(*) FROM pragma_table_info(?1, ?2) WHERE name = 'OrderKey' COLLATE NOCASE)"
        );
        let (columns, queue, history, order_key): (i64, i64, i64, i64) =
            sqlx::query_as(AssertSqlSafe(sql))
                .bind(table.name())
                .bind(table.schema().unwrap_or("main"))
                .bind(table.history().name().to_owned())
                .fetch_one(conn)
                .await
                .map_err(Error::db(context("looking up the table's schema version")))?;
        Ok((columns > 0).then(|| super::version_of(queue > 0, history > 0, order_key > 0)))
    };
    let current = crate::ident::SCHEMA_VERSION;
    if version(&mut conn).await?.is_none_or(|v| v >= current) {
        return Ok(false);
    }
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(Error::db(context("locking the embedded database")))?;
    let Some(from) = version(&mut tx).await?.filter(|v| *v < current) else {
        return Ok(false);
    };
    let what = format!("upgrading the table from schema version {from} to {current}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(upgrade(from)))
        .execute(&mut *tx)
        .await
        .map_err(Error::db(context(&what)))?;
    tx.commit().await.map_err(Error::db(context(&what)))?;
    tracing::info!(
        table = %table,
        from,
        "upgraded the embedded table to schema version {current} (completed commands in {}, \
         queue state in {}, schedules in {})",
        table.history(),
        table.queues(),
        table.schedules()
    );
    Ok(true)
}

// What the embedding API takes of this engine: its pools ([`crate::Queue::from_pool`],
// [`crate::schema::apply`]) and its connections ([`crate::Enqueue`]).

impl super::sealed::Database for sqlx::Sqlite {
    async fn driver(pool: &SqlitePool, table: &TableName) -> Result<Arc<dyn super::Backend>> {
        Ok(Arc::new(
            SqliteDriver::from_pool(pool.clone(), table).await?,
        ))
    }
}

impl super::sealed::Connection for SqliteConnection {}

#[async_trait]
impl crate::Enqueue for SqliteConnection {
    fn engine(&self) -> Engine {
        Engine::Sqlite
    }

    async fn enqueue(&mut self, table: &TableName, command: &NewCommand) -> Result<Scheduled> {
        insert_command(self, table, command).await
    }

    async fn enqueue_many(
        &mut self,
        table: &TableName,
        commands: &[NewCommand],
    ) -> Result<Vec<Scheduled>> {
        insert_commands(self, table, commands).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn synchronous(conn: &mut SqliteConnection) -> i64 {
        sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(conn)
            .await
            .unwrap()
    }

    /// On icq's own pool the processor's writes commit with `NORMAL` (1) and everything
    /// else with `FULL` (2), a schedule on a connection the processor wrote on included.
    #[tokio::test]
    async fn only_the_processors_writes_commit_without_a_sync() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("q.db").display());
        // One connection, so each step below gets the same one.
        let options = ConnectOptions {
            max_connections: 1,
            ..ConnectOptions::default()
        };
        let driver = SqliteDriver::connect(&url, &TableName::default(), &options)
            .await
            .unwrap();
        let mut conn = driver.pool.acquire().await.unwrap();
        assert_eq!(synchronous(&mut conn).await, 2, "a new connection");
        drop(conn);

        driver.keep_work_connections(true);
        let (turn, mut conn) = driver.write_turn("testing").await.unwrap();
        assert_eq!(synchronous(&mut conn).await, 1, "the processor's write");
        // A pool of one keeps nothing: the connection goes back to the pool.
        driver.warm.keep(conn, &driver.pool);
        drop(turn);

        let mut conn = driver.pool.acquire().await.unwrap();
        assert_eq!(
            synchronous(&mut conn).await,
            2,
            "the same connection, handed out again"
        );
        drop(conn);
        driver.close().await;
    }
}
