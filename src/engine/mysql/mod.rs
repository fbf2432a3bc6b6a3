//! MySQL 8 / MariaDB 10.6+: every statement icq runs against a MySQL-family source.
//!
//! There is no `UPDATE … RETURNING` here, so a claim is a short transaction: select the
//! due ids `FOR UPDATE SKIP LOCKED`, stamp them with the lease, read them back. Ids and
//! tokens are `CHAR(36)` text and times `DATETIME(6)` in UTC (`UTC_TIMESTAMP(6)`).
//! Queues, types and unique keys compare byte for byte ([`exact`]) and no statement
//! depends on the connection's or the database's default character set.

mod admin;
pub(crate) mod connect;
mod control;
mod doctor;
mod limited;
mod recurring;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlRow};
use sqlx::{AssertSqlSafe, Connection, Row};
use tokio::sync::Notify;

use chrono::{DateTime, Utc};

use super::cursor;
use super::decode::{Decoder, text_columns, text_id, text_token};
use super::{
    Activity, BenchFillCompletedParams, BenchOps, ClaimParams, ClaimedRow, CommandGetParams,
    CommandInsertManyParams, CommandInsertParams, CommandSetStateAndClaimParams,
    CommandSetStateManyParams, ConnectOptions, Lease, LeaseCheckManyParams, LeaseExtendManyParams,
    LeaseOthersAtHeadParams, Lifecycle, QueueOps, SetState, SweepParams, marks,
};
use crate::command::{CommandId, CommandRow, NewCommand, RunAt, Scheduled};
use crate::error::{Error, Result};
use crate::ident::{Engine, TableName};
use crate::redact::redact_url;

/// SQL for "now".
pub(crate) const NOW: &str = "UTC_TIMESTAMP(6)";

/// The column list every read uses (JSON read back as text on both MySQL and MariaDB).
pub(crate) const COLUMNS: &str = "`Id`, `Type`, CAST(`Payload` AS CHAR) AS `Payload`, `CreatedAt`, \
     `RunAt`, `Attempts`, `LockToken`, `LockedUntil`, `ProcessedAt`, `DeadLetteredAt`, \
     `LastError`, `UserId`, `Roles`, `TenantId`, `CorrelationId`";

/// [`COLUMNS`] and the version-2 columns: what every read of a version-2 table uses
/// ([`MySqlDriver::columns`] picks by the table's version).
pub(crate) const COLUMNS_V2: &str = "`Id`, `Type`, CAST(`Payload` AS CHAR) AS `Payload`, `CreatedAt`, \
     `RunAt`, `Attempts`, `LockToken`, `LockedUntil`, `ProcessedAt`, `DeadLetteredAt`, \
     `LastError`, `UserId`, `Roles`, `TenantId`, `CorrelationId`, `Queue`, `Priority`, \
     `UniqueKey`, `TraceParent`, `Snoozes`";

/// The column list of a full read (operator reads, claims) of a table at schema `version`.
pub(crate) fn columns_of(version: u32) -> &'static str {
    match version {
        4.. => COLUMNS_V4,
        2..4 => COLUMNS_V2,
        _ => COLUMNS,
    }
}

/// [`COLUMNS_V2`] and the version-4 columns.
pub(crate) const COLUMNS_V4: &str = "`Id`, `Type`, CAST(`Payload` AS CHAR) AS `Payload`, `CreatedAt`, \
     `RunAt`, `Attempts`, `LockToken`, `LockedUntil`, `ProcessedAt`, `DeadLetteredAt`, \
     `LastError`, `UserId`, `Roles`, `TenantId`, `CorrelationId`, `Queue`, `Priority`, \
     `UniqueKey`, `TraceParent`, `Snoozes`, `ConcurrencyKey`, `OrderKey`, `Errors`";

/// Set on each connection of icq's own pools (not an application's pool).
const IDLE_TRANSACTION_TIMEOUT: &str = "SET SESSION idle_transaction_timeout = 10";

/// READ COMMITTED for icq's own sessions, unless the server writes a statement-based
/// binary log (which refuses writes at that level). Under the default REPEATABLE READ a
/// claim's locking read keeps a lock on every row it steps over — other processors' leased
/// rows included — until it commits, so their completions wait on it and deadlock with
/// it: four replicas read 104 index entries per command and met a deadlock (and a 100 ms
/// retry) every hundred commands, against 21 entries and none under READ COMMITTED, which
/// lets go of a row the `WHERE` rejects. Every icq statement that must see the latest row
/// is a locking read or an update, which read the latest committed version at any level.
/// MariaDB names the variable `tx_isolation`, MySQL 8 `transaction_isolation`.
const READ_COMMITTED: [&str; 2] = [
    "SET SESSION tx_isolation = IF(@@log_bin = 0 OR @@binlog_format <> 'STATEMENT', \
     'READ-COMMITTED', @@session.tx_isolation)",
    "SET SESSION transaction_isolation = IF(@@log_bin = 0 OR @@binlog_format <> 'STATEMENT', \
     'READ-COMMITTED', @@session.transaction_isolation)",
];

/// A MySQL/MariaDB source: its pool, table and SQL text.
pub struct MySqlDriver {
    pub(crate) pool: MySqlPool,
    pub(crate) table: TableName,
    /// The quoted table name.
    pub(crate) t: String,
    /// The quoted name of its history table (schema version 3).
    pub(crate) h: String,
    sql: Sql,
    /// The table's schema version, once looked up.
    version: super::SchemaVersionCache,
    /// When a claim last looked for rows no claim in priority order settles.
    unusable: super::UnusableGate,
    /// The pool is the application's ([`MySqlDriver::from_pool`]): closing the driver
    /// leaves it open.
    shared_pool: bool,
    /// ` FORCE INDEX (…)` naming the table's poll index when it has the one icq's
    /// migration creates, else empty; looked up once (see [`MySqlDriver::poll_hint`]).
    poll_hint: tokio::sync::OnceCell<Arc<str>>,
    /// Where the next claim of every queue and type starts ([`cursor`]).
    cursor: cursor::ClaimCursor,
    /// The choice of server when the URL lists several ([`connect`]).
    failover: Option<Arc<connect::Failover>>,
}

struct Sql {
    insert: Arc<str>,
    /// The version-2 insert of one row.
    insert_v2: Arc<str>,
    /// `insert_v2` naming the order and concurrency keys too (schema version 4).
    insert_v4: Arc<str>,
    /// The pending row holding a unique key (a locking read: it sees the latest
    /// committed row even in an older snapshot of the caller's transaction).
    pending_by_key: Arc<str>,
    set_state_v1: Arc<str>,
    set_state_v2: Arc<str>,
    /// The set-state statement of a version-4 table: a failure also writes `Errors`.
    set_state_v4: Arc<str>,
    extend: Arc<str>,
    extended: Arc<str>,
    check: Arc<str>,
    sweep: Arc<str>,
    activity: Arc<str>,
    /// On a version-3 table a completion moves its row to history without writing it in
    /// place first: the row copied as completed (under a lock, guarded by the lease
    /// token), then deleted (`?` the same stamps). The copy of a version-4 table is the
    /// second, with its columns.
    copy_completing: [Arc<str>; 2],
    delete_completing: Arc<str>,
    /// A version-3 sweep's delete of old history (`?` µs, `?` limit).
    sweep_history: Arc<str>,
}

/// The completions among the stamps of a JSON array (as [`leases_join`] reads it)
/// joined to the table `c`: the rows they complete, still leased under the stamp's token
/// (a stale success stamp moves nothing). Each row is found by its primary key
/// (`STRAIGHT_JOIN`): on a small table the optimizer otherwise scans `c`, and a locking
/// read that scans waits on the rows other replicas' claims hold.
fn completing_join(t: &str) -> String {
    format!(
        "JSON_TABLE(?, '$[*]' COLUMNS ( \
             id VARCHAR(255) CHARACTER SET utf8mb4 PATH '$[0]', \
             token VARCHAR(64) CHARACTER SET utf8mb4 PATH '$[1]', kind INT PATH '$[2]')) AS s \
         STRAIGHT_JOIN {t} AS c \
           ON c.`Id` = s.id COLLATE utf8mb4_bin AND c.`LockToken` = s.token COLLATE utf8mb4_bin \
         WHERE s.kind = 0"
    )
}

/// The columns of a completed copy of `c` at `version`: completed now, its lease ended.
fn completed_columns(version: u32) -> String {
    crate::engine::columns_of(version)
        .map(|c| match c {
            "ProcessedAt" => NOW.to_owned(),
            "LockToken" | "LockedUntil" => "NULL".to_owned(),
            c => format!("c.`{c}`"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `ON DUPLICATE KEY UPDATE` of an insert into history: an id history already holds
/// (scheduled anew with the same id) keeps its newest completion.
fn history_upsert(version: u32) -> String {
    crate::engine::columns_of(version)
        .skip(1)
        .map(|c| format!("`{c}` = VALUES(`{c}`)"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One row of an insert: nine parameters.
const INSERT_ROW: &str =
    "(?, ?, ?, COALESCE(?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), ?, ?, ?, ?)";

/// One row of a version-2 insert: thirteen parameters.
const INSERT_ROW_V2: &str =
    "(?, ?, ?, COALESCE(?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), ?, ?, ?, ?, ?, ?, ?, ?)";

/// One row of a version-2 insert that names the order and concurrency keys too (schema
/// version 4): fifteen parameters.
const INSERT_ROW_V4: &str = "(?, ?, ?, COALESCE(?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// Takes the retention sweep's lock (`?` the table's lock name, `?` its schema or NULL
/// for the connection's database) without waiting: 1 when taken. At most 10 + 16 + 1 + 16
/// characters, within `GET_LOCK`'s 64.
const SWEEP_LOCK: &str =
    "SELECT GET_LOCK(CONCAT(?, '.', LEFT(SHA1(COALESCE(?, DATABASE(), '')), 16)), 0)";

/// Releases [`SWEEP_LOCK`] (the same two parameters).
const SWEEP_UNLOCK: &str =
    "SELECT RELEASE_LOCK(CONCAT(?, '.', LEFT(SHA1(COALESCE(?, DATABASE(), '')), 16)))";

/// A claim whose `COMMIT` is on its way: when the answer never comes — the connection
/// was lost with it (the server died, or on a cluster the node did), or the call was
/// abandoned at its deadline (dropped mid-commit, e.g. while a cluster stalls) — the claim
/// may have committed all the same (a Galera node replicates a transaction to the cluster
/// before it answers), leaving its rows leased to a token nobody runs: they would wait out
/// the lease. Those rows were never handed to a handler, so they are released in the
/// background ([`Release`]). A commit that answered (either way) releases nothing.
struct UnsettledClaim(Option<Release>);

impl UnsettledClaim {
    /// The commit answered: `Ok` or an error the server reported (it rolled back), or a
    /// lost connection, after which the outcome is unknown.
    fn settled(mut self, err: Option<&sqlx::Error>) {
        let unknown = match err {
            None => false,
            Some(sqlx::Error::Io(_) | sqlx::Error::Protocol(_)) => true,
            Some(sqlx::Error::Database(db)) => db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|my| matches!(my.number(), 2006 | 2013)),
            Some(_) => false,
        };
        if !unknown {
            self.0 = None;
        }
    }
}

impl Drop for UnsettledClaim {
    fn drop(&mut self) {
        if let Some(release) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(release.run());
        }
    }
}

/// Gives back the rows of a claim whose commit's outcome is unknown: `LockToken` back to
/// `NULL`, the attempt given back, over a new connection. Tried until it releases a row or
/// the lease ends: finding none proves nothing yet, since the claim may still be on its
/// way to the node the release runs on (a Galera node applies a dead node's last
/// transaction only once the cluster has a new membership, and a commit abandoned at its
/// deadline may still be waiting). The token is the claim's alone, so this can only ever
/// touch the claim's rows: a claim that never committed releases nothing, and a row
/// claimed again since carries another token.
struct Release {
    pool: MySqlPool,
    sql: String,
    token: String,
    ids: Vec<String>,
    until: std::time::Instant,
}

impl Release {
    async fn run(self) {
        let mut pause = Duration::from_millis(50);
        while std::time::Instant::now() < self.until && !self.pool.is_closed() {
            let mut release = sqlx::query(AssertSqlSafe(self.sql.clone())).bind(&self.token);
            for id in &self.ids {
                release = release.bind(id);
            }
            if let Ok(done) = release.execute(&self.pool).await
                && done.rows_affected() > 0
            {
                tracing::info!(
                    released = done.rows_affected(),
                    "released commands claimed by a commit whose answer was lost"
                );
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }
}

/// How many times a transaction of icq's own that lost a race is run in all.
const LOST_RACE_TRIES: u32 = 4;

/// Runs `transaction` (one whole transaction of icq's own, e.g. a schedule's insert) and
/// again, after a short jittered pause, while it loses a race ([`Error::lost_race`]: a
/// deadlock, or on a Galera cluster a certification conflict with another node's commit,
/// e.g. the same unique key scheduled on two nodes at once): it was rolled back whole, so
/// running it again is safe. Up to [`LOST_RACE_TRIES`] times; then the error is returned.
async fn again_after_lost_races<T, F, Fut>(mut transaction: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match transaction().await {
            Err(err) if err.lost_race() && tries < LOST_RACE_TRIES => {
                use rand::RngExt;
                let ms = rand::rng().random_range(5..=20) * u64::from(tries);
                tracing::debug!(error = %err, tries, retry_in_ms = ms, "a schedule lost a race; running it again");
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            done => return done,
        }
    }
}

/// Rows per multi-row insert.
const INSERT_ROWS_PER_STATEMENT: usize = 1000;

/// The version-2 insert of `rows` rows; with `v4`, naming the order and concurrency keys
/// too.
fn insert_v2_sql(t: &str, rows: usize, v4: bool) -> Arc<str> {
    let (keys, row) = if v4 {
        (", `OrderKey`, `ConcurrencyKey`", INSERT_ROW_V4)
    } else {
        ("", INSERT_ROW_V2)
    };
    format!(
        "INSERT INTO {t} (`Id`, `Type`, `Payload`, `RunAt`, `UserId`, `Roles`, `TenantId`, `CorrelationId`, \
         `Queue`, `Priority`, `UniqueKey`, `TraceParent`{keys}) VALUES {}",
        vec![row; rows].join(", ")
    )
    .into()
}

/// The pending row holding a unique key (bound twice), byte for byte: a table made by an
/// older migration compares its `PendingUniqueKey` with PAD SPACE.
fn pending_by_key_sql(t: &str) -> String {
    format!(
        "SELECT `Id` FROM {t} WHERE `PendingUniqueKey` = ? AND {} = {} LOCK IN SHARE MODE",
        exact("`PendingUniqueKey`"),
        exact_marks(1)
    )
}

/// The pending row whose unique key the unique index finds equal to `?` (on a table made
/// by an older migration, one differing in trailing spaces): its id and key.
fn padded_key_holder_sql(t: &str) -> String {
    format!("SELECT `Id`, `UniqueKey` FROM {t} WHERE `PendingUniqueKey` = ? LOCK IN SHARE MODE")
}

/// Every outcome kind in one statement: 0 completed, 1 retry, 2 dead, 3 release, 4
/// snooze (a release with a move that, on a version-2 table, counts itself in
/// `Snoozes`, saturating).
fn set_state_sql(leases: &str, v2: bool) -> String {
    let snoozes = if v2 {
        "c.`Snoozes` = CASE WHEN s.kind = 4 AND c.`Snoozes` < 2147483647 \
                             THEN c.`Snoozes` + 1 ELSE c.`Snoozes` END, "
    } else {
        ""
    };
    format!(
        "UPDATE {leases} SET \
           c.`ProcessedAt` = CASE WHEN s.kind = 0 THEN {NOW} ELSE c.`ProcessedAt` END, \
           c.`DeadLetteredAt` = CASE WHEN s.kind = 2 THEN {NOW} ELSE c.`DeadLetteredAt` END, \
           c.`RunAt` = CASE WHEN s.delay >= 0 THEN {NOW} + INTERVAL s.delay MICROSECOND \
                            ELSE c.`RunAt` END, \
           c.`LastError` = CASE WHEN s.kind IN (1, 2) THEN s.error ELSE c.`LastError` END, \
           c.`Attempts` = CASE WHEN s.kind IN (3, 4) THEN GREATEST(c.`Attempts` - 1, 0) \
                               ELSE c.`Attempts` END, \
           {snoozes}c.`LockToken` = NULL, c.`LockedUntil` = NULL"
    )
}

/// [`set_state_sql`] of a version-4 table: a retry or a dead-letter also writes `Errors`
/// from the stamp's sixth element (the array the processor computed; absent or NULL
/// leaves it as it is). It reads no column another assignment changes, so the order in
/// which MariaDB assigns does not matter.
fn set_state_v4_sql(leases: &str) -> String {
    let errors = "c.`Errors` = CASE WHEN s.kind IN (1, 2) AND s.errors IS NOT NULL \
                                THEN s.errors ELSE c.`Errors` END, ";
    let update = set_state_sql(leases, true);
    // After the join's `CHARACTER SET`s: the assignments start at the last ` SET `.
    match update.rfind(" SET ") {
        Some(at) => format!("{} SET {errors}{}", &update[..at], &update[at + 5..]),
        None => update,
    }
}

fn insert_sql(t: &str) -> String {
    format!(
        "INSERT INTO {t} (`Id`, `Type`, `Payload`, `RunAt`, `UserId`, `Roles`, `TenantId`, `CorrelationId`) \
         VALUES {INSERT_ROW}"
    )
}

/// The leases of a JSON array of `[id, token, kind, delay µs or -1, error, errors?]`
/// arrays (`errors`, the new `Errors` of a failure, only when stamping) as a
/// table `s`. Its text columns are utf8mb4 by name: a column without a character set
/// takes the database's default (latin1 on some servers), which could neither take the
/// `utf8mb4_bin` collation nor hold every error text. Ids compare binary, exactly as
/// stored, whatever the connection's collation.
fn leases_join(t: &str) -> String {
    format!(
        "{t} AS c JOIN JSON_TABLE(?, '$[*]' COLUMNS ( \
             id VARCHAR(255) CHARACTER SET utf8mb4 PATH '$[0]', \
             token VARCHAR(64) CHARACTER SET utf8mb4 PATH '$[1]', kind INT PATH '$[2]', \
             delay BIGINT PATH '$[3]', error LONGTEXT CHARACTER SET utf8mb4 PATH '$[4]', \
             errors LONGTEXT CHARACTER SET utf8mb4 PATH '$[5]')) AS s \
           ON c.`Id` = s.id COLLATE utf8mb4_bin AND c.`LockToken` = s.token COLLATE utf8mb4_bin"
    )
}

/// `column` as bytes, for comparisons with [`exact_marks`]: byte for byte, where the
/// table's `utf8mb4_bin` (PAD SPACE) would find `emails` equal to `emails `. Beside an
/// indexed comparison of the same column, which keeps the index in use.
pub(crate) fn exact(column: &str) -> String {
    format!("CAST({column} AS BINARY)")
}

/// `n` comma-separated parameters as their utf8mb4 bytes (see [`exact`]), whatever the
/// connection's character set.
pub(crate) fn exact_marks(n: usize) -> String {
    vec!["CAST(CONVERT(? USING utf8mb4) AS BINARY)"; n].join(", ")
}

impl Sql {
    fn new(t: &str, h: &str) -> Sql {
        let leases = leases_join(t);
        let completing = completing_join(t);
        // `FOR UPDATE`: under READ COMMITTED a plain copy reads without locking, and a
        // lease lapsed and taken meanwhile would be copied as completed and then kept.
        let copy_completing = |version| {
            let columns = crate::engine::column_list(Engine::Mysql, "", version);
            format!(
                "INSERT INTO {h} ({columns}) SELECT {} FROM {completing} FOR UPDATE \
                 ON DUPLICATE KEY UPDATE {}",
                completed_columns(version),
                history_upsert(version)
            )
            .into()
        };
        Sql {
            copy_completing: [copy_completing(3), copy_completing(4)],
            delete_completing: format!("DELETE c FROM {completing}").into(),
            sweep_history: format!(
                "DELETE FROM {h} WHERE `ProcessedAt` < {NOW} - INTERVAL ? MICROSECOND \
                 ORDER BY `ProcessedAt` LIMIT ?"
            )
            .into(),
            insert: insert_sql(t).into(),
            insert_v2: insert_v2_sql(t, 1, false),
            insert_v4: insert_v2_sql(t, 1, true),
            pending_by_key: pending_by_key_sql(t).into(),
            set_state_v1: set_state_sql(&leases, false).into(),
            set_state_v2: set_state_sql(&leases, true).into(),
            set_state_v4: set_state_v4_sql(&leases).into(),
            extend: format!("UPDATE {leases} SET c.`LockedUntil` = {NOW} + INTERVAL ? MICROSECOND")
                .into(),
            extended: format!("SELECT c.`Id`, c.`LockToken` FROM {leases}").into(),
            check: format!(
                "SELECT c.`Id`, c.`LockToken` FROM {leases} \
                 WHERE c.`ProcessedAt` IS NULL AND c.`DeadLetteredAt` IS NULL"
            )
            .into(),
            sweep: format!(
                "DELETE FROM {t} WHERE `ProcessedAt` IS NOT NULL \
                   AND `ProcessedAt` < {NOW} - INTERVAL ? MICROSECOND \
                 ORDER BY `ProcessedAt` LIMIT ?"
            )
            .into(),
            activity: activity_sql(t, "").into(),
        }
    }
}

fn activity_sql(t: &str, filter: &str) -> String {
    format!(
        "SELECT \
           CAST(COALESCE(SUM(`LockedUntil` IS NULL OR `LockedUntil` <= {NOW}), 0) AS SIGNED) AS due, \
           CAST(COALESCE(SUM(`LockedUntil` > {NOW}), 0) AS SIGNED) AS running \
         FROM {t} \
         WHERE `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL \
           AND (`RunAt` <= {NOW} OR `RunAt` IS NULL OR `LockedUntil` > {NOW}){filter}"
    )
}

/// Leaves out the rows of `t` whose queue is paused in its queue-state table `q`.
fn paused_filter(t: &str, q: &str) -> String {
    format!(
        " AND NOT EXISTS (SELECT 1 FROM {q} AS p \
           WHERE p.`Queue` = {t}.`Queue` AND p.`Paused` <> 0)"
    )
}

/// The select of a claim: `types` types only, `queues` (a version-2 table) those queues
/// only, never the `except` ids that follow them (the rows the same transaction has just
/// stamped, which a release or a retry without delay leaves due, are not claimed back,
/// as on PostgreSQL, whose one statement sees them leased), with `after` (a version-2
/// claim of every queue and type) only rows after a [`cursor::Position`] in claim order.
/// Types and queues compare byte for byte ([`exact`]). Parameters in order: the
/// processing delay, the types twice, the queues twice, the position (priority, priority,
/// `RunAt`, priority, `RunAt`, id), the except ids, the limit.
#[allow(clippy::too_many_arguments)]
fn claim_select_sql(
    t: &str,
    select: &str,
    hint: &str,
    v2: bool,
    types: usize,
    queues: Option<&[String]>,
    after: bool,
    except: usize,
    unusable: bool,
    paused: Option<&str>,
    ordered: bool,
) -> String {
    let mut filter = if types == 0 {
        String::new()
    } else {
        format!(
            " AND `Type` IN ({}) AND {} IN ({})",
            marks(types),
            exact("`Type`"),
            exact_marks(types)
        )
    };
    // Named queues other than 'default' are seeks in the queue poll index (its key,
    // `PollQueue`, is the queue of pending rows outside 'default'); a list with 'default'
    // reads the poll index and filters by `Queue`. A queue named 'default' and trailing
    // spaces has no `PollQueue` on a table made by an older migration (which compared it
    // with 'default' ignoring them), so it is looked for like 'default'.
    let column = match queues {
        Some(list)
            if !list
                .iter()
                .any(|q| q.trim_end_matches(' ') == crate::command::DEFAULT_QUEUE) =>
        {
            "`PollQueue`"
        }
        _ => "`Queue`",
    };
    match queues.map(<[String]>::len) {
        None => {}
        Some(0) => filter.push_str(" AND `Queue` IN (NULL)"),
        Some(n) => filter.push_str(&format!(
            " AND {column} IN ({}) AND {} IN ({})",
            marks(n),
            exact("`Queue`"),
            exact_marks(n)
        )),
    }
    // Spelled out rather than as a row comparison, which MariaDB's range optimizer does
    // not turn into a seek; with the primary key the poll index ends with, it is one.
    if after {
        filter.push_str(
            " AND (`Priority` > ? OR (`Priority` = ? AND `RunAt` > ?) \
             OR (`Priority` = ? AND `RunAt` = ? AND `Id` > ?))",
        );
    }
    if except > 0 {
        filter.push_str(&format!(" AND `Id` NOT IN ({})", marks(except)));
    }
    // Rows of paused queues (in `<table>Queues`, named `paused`) stay: looked up only
    // while some queue is paused.
    if let Some(queues_table) = paused {
        filter.push_str(&paused_filter(t, queues_table));
    }
    if ordered {
        filter.push_str(&ordered_filter(t));
    }
    let order = match (v2, after) {
        (true, true) => "`Priority`, `RunAt`, `Id`",
        (true, false) => "`Priority`, `RunAt`",
        (false, _) => "`RunAt`",
    };
    // The second part: a few pending rows whose `RunAt` is NULL (another program relaxed
    // NOT NULL), which no time makes due, or (version 2) whose `Queue` is NULL, which no
    // queue filter matches: claimed as they are, dead-lettered by the executor naming
    // the column. A seek on the version-1 poll index; on version 2 (whose poll indexes
    // lead with `Priority` and `Queue`) made now and then only.
    let unusable = match (unusable, v2) {
        (false, _) => String::new(),
        (true, false) => format!(
            " UNION ALL \
             (SELECT {select} FROM {t} \
             WHERE `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL AND `RunAt` IS NULL \
               AND (`LockedUntil` IS NULL OR `LockedUntil` <= {NOW}) \
             LIMIT 10 FOR UPDATE SKIP LOCKED)"
        ),
        (true, true) => format!(
            " UNION ALL \
             (SELECT {select} FROM {t} \
             WHERE `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL \
               AND (`RunAt` IS NULL OR `Queue` IS NULL) \
               AND (`LockedUntil` IS NULL OR `LockedUntil` <= {NOW}) \
             LIMIT 10 FOR UPDATE SKIP LOCKED)"
        ),
    };
    // The poll index is named only for a claim of every queue (a queue's claim has its
    // own index, which the planner finds by the `Queue` equality).
    let hint = if queues.is_none() { hint } else { "" };
    format!(
        "(SELECT {select} FROM {t}{hint} \
         WHERE `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL \
           AND `RunAt` <= {NOW} \
           AND (`LockedUntil` IS NULL OR `LockedUntil` <= {NOW}) \
           AND (`CreatedAt` <= {NOW} - INTERVAL ? MICROSECOND OR `CreatedAt` IS NULL){filter} \
         ORDER BY {order} LIMIT ? FOR UPDATE SKIP LOCKED){unusable}"
    )
}

/// The ordered-key condition of a claim's select from `t` (version 4): a row with an
/// `OrderKey` is claimable only when no other pending row of its key is older by
/// (`CreatedAt`, `Id`), so a key's rows run one at a time in the order they were
/// scheduled, and one that runs or waits for a retry holds the younger ones until it
/// completes or is dead-lettered. A row without a key stops at `IS NULL`; a keyed one is
/// a seek in `IX_<t>_OrderKey`. The subquery is a consistent (non-locking) read under the
/// claim's `FOR UPDATE SKIP LOCKED`: a head another claim is locking is still seen, not
/// skipped. Spelled out rather than as a row comparison, which MariaDB does not seek on.
/// The stamps of a stamp-and-claim come first in its transaction, so a head completed
/// there frees the next row for the same claim.
fn ordered_filter(t: &str) -> String {
    format!(
        " AND (`OrderKey` IS NULL OR NOT EXISTS ( \
             SELECT 1 FROM {t} AS o \
             WHERE o.`OrderKey` = {t}.`OrderKey` \
               AND o.`ProcessedAt` IS NULL AND o.`DeadLetteredAt` IS NULL \
               AND (o.`CreatedAt` < {t}.`CreatedAt` \
                    OR (o.`CreatedAt` = {t}.`CreatedAt` AND o.`Id` < {t}.`Id`))))"
    )
}

/// `row`, read before the claim's update, as that update left it: leased with `token`
/// until `until`, and `Attempts` counted as the statement counts it (a count from 0 to
/// 2147483646 grows by one; NULL, negative and the maximum stay as stored).
fn leased_as_updated(
    row: &mut CommandRow,
    token: crate::command::LeaseToken,
    until: Option<DateTime<Utc>>,
) {
    row.lock_token = Some(token);
    row.locked_until = until;
    let unreadable = row.defects.iter().any(|d| d.starts_with("column Attempts"));
    if !unreadable && (0..i32::MAX).contains(&row.attempts) {
        row.attempts += 1;
    }
}

/// The stamps of `changes` as the set-state statements' JSON array: lease, kind, delay in
/// µs (-1: none), error, and (read on version 4) the attempts' errors.
fn stamps_json<'a>(changes: impl IntoIterator<Item = &'a SetState>) -> String {
    leases_json(changes.into_iter().map(|c| {
        let delay = c
            .delay_seconds()
            .map_or(-1, |s| micros(Duration::from_secs_f64(s.max(0.0))));
        (&c.lease, c.kind(), delay, c.error(), c.errors())
    }))
}

/// The JSON array the lease statements read with `JSON_TABLE`.
fn leases_json<'a>(
    rows: impl Iterator<Item = (&'a Lease, i16, i64, Option<String>, Option<&'a str>)>,
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

/// A stable 64-bit FNV-1a hash, for lock names every replica computes alike.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Microseconds in `d`, for `INTERVAL ? MICROSECOND`.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Inserts `command` through `conn` — a pooled connection or, with `&mut *tx`, the
/// caller's open transaction, so the command commits or rolls back with it. With a
/// unique key whose pending row exists (committed, or inserted earlier in the same
/// transaction), inserts nothing and returns that row's id (`existing: true`).
pub async fn insert_command(
    conn: &mut MySqlConnection,
    table: &TableName,
    command: &NewCommand,
) -> Result<Scheduled> {
    command.validate()?;
    let t = table.quoted(Engine::Mysql);
    let version = if command.uses_v2_columns() {
        table_version(conn, table).await?
    } else {
        1
    };
    let sql = Inserts {
        v1: insert_sql(&t).into(),
        v2: insert_v2_sql(&t, 1, false),
        v4: insert_v2_sql(&t, 1, true),
        by_key: pending_by_key_sql(&t).into(),
    };
    insert_one(conn, &sql, table, command, version).await
}

/// Inserts `commands` (validated, of a table of schema `version`) through `conn`, which
/// is inside a transaction: runs of commands without a unique key in multi-row
/// statements of at most [`INSERT_ROWS_PER_STATEMENT`] rows (well within MySQL's 65,535
/// placeholders) that fit the server's `max_allowed_packet`, each with a key on its own
/// (it may meet a pending row, or one earlier in the batch). One [`Scheduled`] per
/// command, in order.
async fn insert_many(
    conn: &mut MySqlConnection,
    inserts: &Inserts,
    t: &str,
    table: &TableName,
    commands: &[NewCommand],
    version: u32,
) -> Result<Vec<Scheduled>> {
    let v2 = version >= 2 && commands.iter().any(NewCommand::uses_v2_columns);
    // Only a batch that sets a key names the version-4 columns.
    let v4 = v2 && commands.iter().any(|c| c.needs_v4().is_some());
    // Each payload is serialized once; a batch of large ones is split into statements
    // that fit the server's max_allowed_packet.
    let mut payloads: Vec<String> = commands.iter().map(|c| c.payload.to_string()).collect();
    let sizes: Vec<usize> = commands
        .iter()
        .zip(&payloads)
        .map(|(c, p)| row_bytes((c, p)))
        .collect();
    let limit = packet_limit(&mut *conn, table, sizes.iter().sum()).await?;
    let budget = limit.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
    let mut scheduled = Vec::with_capacity(commands.len());
    let mut full: Option<Arc<str>> = None;
    // Runs of commands without a unique key go in multi-row statements; each with one
    // on its own (it may meet a pending row, or one earlier in the batch).
    let mut rest = commands;
    while !rest.is_empty() {
        let done = commands.len() - rest.len();
        if v2 && rest[0].unique_key.is_some() {
            scheduled.push(insert_one(&mut *conn, inserts, table, &rest[0], version).await?);
            rest = &rest[1..];
            continue;
        }
        let mut bytes = 0;
        let run = rest
            .iter()
            .zip(&sizes[done..])
            .take(INSERT_ROWS_PER_STATEMENT)
            .take_while(|(c, size)| {
                bytes += **size;
                !(v2 && c.unique_key.is_some()) && bytes <= budget
            })
            .count()
            .max(1);
        let (chunk, after) = rest.split_at(run);
        let chunk_payloads = payloads[done..done + run]
            .iter_mut()
            .map(std::mem::take)
            .collect();
        let render = || -> Arc<str> {
            if v2 {
                insert_v2_sql(t, chunk.len(), v4)
            } else {
                format!(
                    "INSERT INTO {t} (`Id`, `Type`, `Payload`, `RunAt`, `UserId`, `Roles`, `TenantId`, `CorrelationId`) VALUES {}",
                    vec![INSERT_ROW; chunk.len()].join(", ")
                )
                .into()
            }
        };
        let sql = if chunk.len() == INSERT_ROWS_PER_STATEMENT {
            full.get_or_insert_with(render).clone()
        } else {
            render()
        };
        insert_rows(&mut *conn, &sql, table, chunk, chunk_payloads, v2, v4).await?;
        scheduled.extend(chunk.iter().map(|c| Scheduled::new(c.id.clone())));
        rest = after;
    }
    Ok(scheduled)
}

/// Inserts `commands` through `conn` — a pooled connection or, with `&mut *tx`, the
/// caller's open transaction — in bulk ([`insert_many`]), inside a savepoint of its own,
/// so a failure leaves none of them and the caller's transaction usable.
pub async fn insert_commands(
    conn: &mut MySqlConnection,
    table: &TableName,
    commands: &[NewCommand],
) -> Result<Vec<Scheduled>> {
    super::validate_batch(commands)?;
    if commands.is_empty() {
        return Ok(Vec::new());
    }
    let t = table.quoted(Engine::Mysql);
    let version = super::batch_version(commands, table_version(conn, table)).await?;
    super::refuse_newer_asks(table, version, commands.iter())?;
    let inserts = Inserts {
        v1: insert_sql(&t).into(),
        v2: insert_v2_sql(&t, 1, false),
        v4: insert_v2_sql(&t, 1, true),
        by_key: pending_by_key_sql(&t).into(),
    };
    let context = || format!("scheduling commands in bulk into {table}");
    let mut savepoint = sqlx::Connection::begin(&mut *conn)
        .await
        .map_err(Error::db(context()))?;
    let scheduled = insert_many(&mut savepoint, &inserts, &t, table, commands, version).await?;
    savepoint.commit().await.map_err(Error::db(context()))?;
    Ok(scheduled)
}

/// The schema version of `table` as `conn` sees it.
async fn table_version(conn: &mut MySqlConnection, table: &TableName) -> Result<u32> {
    let (queue, order_key): (i64, i64) = sqlx::query_as(
        "SELECT CAST(COALESCE(SUM(column_name = 'Queue'), 0) AS SIGNED), \
                CAST(COALESCE(SUM(column_name = 'OrderKey'), 0) AS SIGNED) \
         FROM information_schema.columns \
         WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? \
           AND column_name IN ('Queue', 'OrderKey')",
    )
    .bind(table.schema())
    .bind(table.name())
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

/// The insert statements [`insert_one`] chooses from.
struct Inserts {
    v1: Arc<str>,
    v2: Arc<str>,
    /// `v2` naming the order and concurrency keys too, for a command that sets one.
    v4: Arc<str>,
    by_key: Arc<str>,
}

/// Inserts one command: the version-1 statement when it names no version-2 column, else
/// the version-2 one; with a unique key a pending row holds, the insert fails on the
/// unique index (a plain INSERT: `INSERT IGNORE` would hide other errors too) and that
/// row's id is returned instead. A failed statement leaves the caller's transaction as
/// it was.
async fn insert_one(
    conn: &mut MySqlConnection,
    sql: &Inserts,
    table: &TableName,
    command: &NewCommand,
    version: u32,
) -> Result<Scheduled> {
    command.validate()?;
    super::refuse_newer_asks(table, version, std::iter::once(command))?;
    let v2 = version >= 2 && command.uses_v2_columns();
    let v4 = v2 && command.needs_v4().is_some();
    let v2_sql = if v4 { &sql.v4 } else { &sql.v2 };
    let Some(key) = command.unique_key.as_ref().filter(|_| v2) else {
        let statement = if v2 { v2_sql } else { &sql.v1 };
        let payloads = vec![command.payload.to_string()];
        insert_rows(
            conn,
            statement,
            table,
            std::slice::from_ref(command),
            payloads,
            v2,
            v4,
        )
        .await?;
        return Ok(Scheduled::new(command.id.clone()));
    };
    let context = || format!("scheduling a command into {table}");
    let payload = command.payload.to_string();
    check_packet(conn, table, &[(command, payload.as_str())]).await?;
    for _ in 0..super::UNIQUE_KEY_TRIES {
        let query = sqlx::query(AssertSqlSafe(v2_sql.clone()));
        let inserted = bind_row(query, command, payload.clone(), true, v4)
            .execute(&mut *conn)
            .await;
        match inserted {
            Ok(_) => return Ok(Scheduled::new(command.id.clone())),
            Err(err) if held_key(&err) => {}
            Err(err) => return Err(Error::db(context())(err)),
        }
        let existing: Option<String> = sqlx::query_scalar(AssertSqlSafe(sql.by_key.clone()))
            .bind(key)
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
        // No row holds this very key: on a table made by an older migration, one whose
        // key differs in trailing spaces may fill its place in the unique index.
        let t = table.quoted(Engine::Mysql);
        let padded: Option<(String, Option<String>)> =
            sqlx::query_as(AssertSqlSafe(padded_key_holder_sql(&t)))
                .bind(key)
                .fetch_optional(&mut *conn)
                .await
                .map_err(Error::db(context()))?;
        if let Some((id, Some(held))) = padded
            && held != *key
        {
            return Err(padded_key_collision(table, key, &id, &held));
        }
    }
    Err(super::unique_key_unsettled(table, key))
}

/// The statement that makes the unique-key and queue poll indexes of `t` (made by an
/// older migration, whose generated columns compare with PAD SPACE) compare byte for
/// byte, as the current migration makes them.
fn byte_exact_indexes_sql(t: &str) -> String {
    format!(
        "ALTER TABLE {t} \
         MODIFY `PendingUniqueKey` VARBINARY(1020) AS (IF(`ProcessedAt` IS NULL AND \
         `DeadLetteredAt` IS NULL, CAST(`UniqueKey` AS BINARY), NULL)) STORED, \
         MODIFY `PollQueue` VARBINARY(512) AS (IF(`ProcessedAt` IS NULL AND \
         `DeadLetteredAt` IS NULL AND CAST(`Queue` AS BINARY) <> 'default', \
         CAST(`Queue` AS BINARY), NULL)) STORED;"
    )
}

/// A unique key refused because the table's unique index (made by an older migration)
/// finds it equal to pending command `id`'s key `held`, which differs in trailing spaces.
fn padded_key_collision(table: &TableName, key: &str, id: &str, held: &str) -> Error {
    Error::Conflict(format!(
        "scheduling into {table}: unique key {key:?} is taken in the table's unique-key \
         index by pending command {id}, whose key {held:?} differs from it only in trailing \
         spaces: the table was created by an older icq migration, whose index ignores \
         trailing spaces (MariaDB and MySQL compare utf8mb4_bin with PAD SPACE). Nothing \
         was scheduled. To make unique keys and queues compare byte for byte, apply this \
         in a migration of your own (it copies the table, like the version-2 upgrade): {}",
        byte_exact_indexes_sql(&table.quoted(Engine::Mysql))
    ))
}

/// Whether `err` is a duplicate in the unique-key index (not the primary key: a reused
/// `Id` stays an error).
fn held_key(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .is_some_and(|db| db.is_unique_violation() && !db.message().contains("PRIMARY"))
}

type MySqlQuery<'q> = sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>;

/// Binds one row of an insert (thirteen parameters with `v2`, fifteen with `v4` too, else
/// nine), `payload` being the command's payload as JSON text.
fn bind_row<'q>(
    query: MySqlQuery<'q>,
    command: &NewCommand,
    payload: String,
    v2: bool,
    v4: bool,
) -> MySqlQuery<'q> {
    let (at, delay) = match command.run_at {
        RunAt::Now => (None, 0),
        RunAt::At(at) => (Some(at.naive_utc()), 0),
        RunAt::After(delay) => (None, micros(delay)),
    };
    let ctx = &command.context;
    let query = query
        .bind(command.id.to_string())
        .bind(command.type_name.clone())
        .bind(payload)
        .bind(at)
        .bind(delay)
        .bind(ctx.user_id.clone())
        .bind(ctx.roles_json())
        .bind(ctx.tenant_id.clone())
        .bind(ctx.correlation_id.clone());
    if !v2 {
        return query;
    }
    let query = query
        .bind(command.queue.clone())
        .bind(command.priority)
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
/// the version-2 columns with `v2`, and the keys with `v4`); `payloads` are their payloads
/// as JSON text.
async fn insert_rows(
    conn: &mut MySqlConnection,
    sql: &Arc<str>,
    table: &TableName,
    commands: &[NewCommand],
    payloads: Vec<String>,
    v2: bool,
    v4: bool,
) -> Result<()> {
    for command in commands {
        command.validate()?;
    }
    let rows: Vec<(&NewCommand, &str)> = commands
        .iter()
        .zip(payloads.iter().map(String::as_str))
        .collect();
    check_packet(&mut *conn, table, &rows).await?;
    let mut query = sqlx::query(AssertSqlSafe(sql.clone()));
    for (command, payload) in commands.iter().zip(payloads) {
        query = bind_row(query, command, payload, v2, v4);
    }
    query
        .execute(conn)
        .await
        .map_err(Error::db(format!("scheduling commands into {table}")))?;
    Ok(())
}

/// Below this many bytes a statement is not checked against `max_allowed_packet`: no
/// MariaDB or MySQL release defaults to less than 1 MiB (MariaDB 10.2.4+ 16 MiB, MySQL
/// 8 64 MiB), so only large inserts pay the extra round trip.
const PACKET_CHECK_FROM: usize = 1 << 20;

/// About how many bytes a prepared insert of `row` takes on the wire: every bound
/// value plus a few bytes of header each.
fn row_bytes((command, payload): (&NewCommand, &str)) -> usize {
    let ctx = &command.context;
    let texts = [
        Some(command.id.as_str()),
        Some(command.type_name.as_str()),
        Some(payload),
        ctx.user_id.as_deref(),
        ctx.tenant_id.as_deref(),
        ctx.correlation_id.as_deref(),
        Some(command.queue.as_str()),
        command.unique_key.as_deref(),
        command.trace_parent.as_deref(),
        command.order_key.as_deref(),
        command.concurrency_key.as_deref(),
    ];
    let roles: usize = ctx.roles.iter().map(|r| r.len() + 3).sum();
    texts.iter().flatten().map(|t| t.len()).sum::<usize>() + roles + 13 * 12
}

/// Refuses, before anything is sent, an insert larger than the server's
/// `max_allowed_packet`: the server would drop the connection mid-statement, which the
/// client reports only as "Connection reset by peer". Inserts below
/// [`PACKET_CHECK_FROM`] are not checked.
async fn check_packet(
    conn: &mut MySqlConnection,
    table: &TableName,
    rows: &[(&NewCommand, &str)],
) -> Result<()> {
    let bytes: usize = rows.iter().copied().map(row_bytes).sum();
    let Some(limit) = packet_limit(conn, table, bytes).await? else {
        return Ok(());
    };
    if bytes as u64 <= limit {
        return Ok(());
    }
    let (largest, largest_bytes) = rows
        .iter()
        .map(|&row| (row.0, row_bytes(row)))
        .max_by_key(|&(_, b)| b)
        .unwrap_or((rows[0].0, bytes));
    let what = if rows.len() == 1 || largest_bytes as u64 > limit {
        format!(
            "command {} (type `{}`) is {largest_bytes} bytes as sent",
            largest.id, largest.type_name
        )
    } else {
        format!(
            "a statement of {} commands is {bytes} bytes as sent",
            rows.len()
        )
    };
    Err(Error::invalid(format!(
        "scheduling into {table}: {what}, more than the server's max_allowed_packet \
         ({limit} bytes), so the server would refuse it and drop the connection; raise the \
         server variable max_allowed_packet (SET GLOBAL max_allowed_packet = ..., or in the \
         server's configuration) or schedule a smaller payload (keep large data elsewhere \
         and pass a reference); nothing was scheduled"
    )))
}

/// The server's `max_allowed_packet` when a statement of `bytes` bytes needs checking
/// against it (at least [`PACKET_CHECK_FROM`]), else `None` without asking.
async fn packet_limit(
    conn: &mut MySqlConnection,
    table: &TableName,
    bytes: usize,
) -> Result<Option<u64>> {
    if bytes < PACKET_CHECK_FROM {
        return Ok(None);
    }
    let limit: u64 = sqlx::query_scalar("SELECT @@max_allowed_packet")
        .fetch_one(conn)
        .await
        .map_err(Error::db(format!(
            "reading max_allowed_packet before scheduling into {table}"
        )))?;
    Ok(Some(limit))
}

fn optional_time(d: &mut Decoder, row: &MySqlRow, column: &str) -> Option<DateTime<Utc>> {
    d.get::<_, Option<chrono::NaiveDateTime>>(row, column)
        .flatten()
        .map(|naive| naive.and_utc())
}

fn required_time(d: &mut Decoder, row: &MySqlRow, column: &str) -> DateTime<Utc> {
    match d.get::<_, Option<chrono::NaiveDateTime>>(row, column) {
        Some(Some(naive)) => naive.and_utc(),
        Some(None) => {
            d.defect(column, "NULL");
            DateTime::<Utc>::UNIX_EPOCH
        }
        None => DateTime::<Utc>::UNIX_EPOCH,
    }
}

/// The payload's size in bytes as the row holds it (its text), for the producer's
/// buffered-bytes budget; 0 when it is not text.
pub(crate) fn payload_bytes(row: &MySqlRow) -> usize {
    row.try_get_unchecked::<&str, _>("Payload")
        .map_or(0, str::len)
}

/// Decodes a row read with [`COLUMNS`] column by column; only an unreadable `Id` fails
/// it (the row could not be stamped anyway).
pub(crate) fn decode_row(row: &MySqlRow) -> std::result::Result<CommandRow, sqlx::Error> {
    let mut d = Decoder::default();
    let mut out = CommandRow::placeholder(text_id(row)?);
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

impl MySqlDriver {
    /// Connects a pool to `url` for `table`. `mariadb://` URLs are accepted as `mysql://`.
    /// A URL may list several hosts (`mysql://u@g1:3306,g2:3307/db`): see [`connect`].
    pub async fn connect(url: &str, table: &TableName, options: &ConnectOptions) -> Result<Self> {
        let hosts = connect::parse(url)?;
        let failover = if hosts.len() > 1 {
            Some(connect::Failover::start(url, hosts).await?)
        } else {
            None
        };
        let several = failover.is_some();
        let pool = options
            .pool::<sqlx::MySql>()
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    // A Galera node out of the primary component or not synced: another
                    // node of the list takes the source's writes (the watcher switches).
                    if several && let Some(reason) = connect::galera_refusal(conn).await? {
                        return Err(sqlx::Error::Protocol(format!(
                            "{reason}: looking for another node of the URL's hosts"
                        )));
                    }
                    // MariaDB ends a session left idle inside a transaction after this
                    // long, releasing its row locks. icq's own transactions (a claim, a
                    // stamp) never wait between statements; one idle this long belongs
                    // to a connection the processor abandoned on a stalled socket, whose
                    // locks would otherwise hide the rows from every claim (SKIP LOCKED)
                    // until the server noticed the dead peer. MySQL has no such setting:
                    // the statement fails there and is ignored.
                    let _ = sqlx::raw_sql(IDLE_TRANSACTION_TIMEOUT)
                        .execute(&mut *conn)
                        .await;
                    for statement in READ_COMMITTED {
                        if sqlx::raw_sql(statement).execute(&mut *conn).await.is_ok() {
                            break;
                        }
                    }
                    Ok(())
                })
            });
        let connected = match &failover {
            Some(failover) => {
                failover
                    .pool_options(pool)
                    .connect_with(failover.current_options())
                    .await
            }
            None => pool.connect(&connect::normalized(url)).await,
        };
        let pool = connected.map_err(Error::db(format!("connecting to {}", redact_url(url))))?;
        if let Some(failover) = &failover {
            failover.adopt(&pool);
        }
        let mut driver = Self::on_pool(pool, table, false).await?;
        driver.failover = failover;
        Ok(driver)
    }

    /// A driver on the application's own pool, for `table`. Closing the driver leaves
    /// `pool` open.
    pub(crate) async fn from_pool(pool: MySqlPool, table: &TableName) -> Result<Self> {
        Self::on_pool(pool, table, true).await
    }

    /// The driver on `pool`, once `table`'s schema (database) is found to exist.
    async fn on_pool(pool: MySqlPool, table: &TableName, shared_pool: bool) -> Result<Self> {
        if let Some(schema) = table.schema() {
            // On MySQL/MariaDB the schema is a database: a missing one is a different
            // mistake from a missing table, so say which.
            let found: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?",
            )
            .bind(schema)
            .fetch_one(&pool)
            .await
            .map_err(Error::db(format!("looking up the schema of {table}")))?;
            if found == 0 {
                if !shared_pool {
                    pool.close().await;
                }
                return Err(Error::schema_missing(table, Engine::Mysql));
            }
        }
        let (t, h) = (
            table.quoted(Engine::Mysql),
            table.history().quoted(Engine::Mysql),
        );
        Ok(MySqlDriver {
            pool,
            table: table.clone(),
            sql: Sql::new(&t, &h),
            t,
            h,
            version: Default::default(),
            cursor: cursor::ClaimCursor::default(),
            unusable: Default::default(),
            shared_pool,
            poll_hint: tokio::sync::OnceCell::new(),
            failover: None,
        })
    }

    /// ` FORCE INDEX (`IX_<table>_Poll`)` when the table has that index leading with the
    /// two state columns (icq's migration creates it), else empty. MariaDB's planner,
    /// estimating from statistics in which every row is pending (a freshly loaded table)
    /// or in which `NULL`s form one group, reads the version-2 poll index as a `range`
    /// without index condition pushdown, examining ~1.7× the rows per claim, and counts
    /// `--until-idle`'s activity with a scan of the whole table (every retained row); the
    /// hint keeps both on the index. A table whose indexes another migration renamed
    /// gets no hint (a hint naming a missing index fails the statement).
    async fn poll_hint(&self) -> Result<Arc<str>> {
        let found = self
            .poll_hint
            .get_or_try_init(|| async {
                let name = format!("IX_{}_Poll", self.table.name());
                let leading: Vec<String> = sqlx::query_scalar(
                    "SELECT CAST(column_name AS CHAR) FROM information_schema.statistics \
                     WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? \
                       AND index_name = ? ORDER BY seq_in_index LIMIT 2",
                )
                .bind(self.table.schema())
                .bind(self.table.name())
                .bind(&name)
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db(self.ctx("looking up the table's poll index")))?;
                let hint: Arc<str> = if leading == ["ProcessedAt", "DeadLetteredAt"] {
                    format!(
                        " FORCE INDEX ({})",
                        self.table.derived(Engine::Mysql, "IX_", "_Poll")
                    )
                    .into()
                } else {
                    "".into()
                };
                Ok::<_, Error>(hint)
            })
            .await?;
        Ok(found.clone())
    }

    fn ctx(&self, what: &str) -> String {
        format!("{what} ({})", self.table)
    }

    /// The insert statements of this table.
    fn inserts(&self) -> Inserts {
        Inserts {
            v1: self.sql.insert.clone(),
            v2: self.sql.insert_v2.clone(),
            v4: self.sql.insert_v4.clone(),
            by_key: self.sql.pending_by_key.clone(),
        }
    }

    /// One batch of a version-3 sweep, in one transaction: up to `limit` of the oldest
    /// completed rows left in the table (by an icq older than version 3 during a rolling
    /// upgrade, or by another program; rows other statements hold are skipped) move to
    /// history (with the columns of `version`), and up to `limit` history rows older than
    /// the retention go. Returns how many rows moved and went.
    async fn sweep_v3(
        &self,
        conn: &mut MySqlConnection,
        params: &SweepParams,
        version: u32,
    ) -> std::result::Result<u64, sqlx::Error> {
        let (t, h) = (&self.t, &self.h);
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let ids: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT `Id` FROM {t} WHERE `ProcessedAt` IS NOT NULL \
             ORDER BY `ProcessedAt` LIMIT ? FOR UPDATE SKIP LOCKED"
        )))
        .bind(i64::from(params.limit))
        .fetch_all(&mut *tx)
        .await?;
        let mut done = 0;
        if !ids.is_empty() {
            let columns = crate::engine::column_list(Engine::Mysql, "", version);
            let marks = super::marks(ids.len());
            let copy = format!(
                "INSERT INTO {h} ({columns}) SELECT {columns} FROM {t} WHERE `Id` IN ({marks}) \
                 ON DUPLICATE KEY UPDATE {}",
                history_upsert(version)
            );
            let delete = format!("DELETE FROM {t} WHERE `Id` IN ({marks})");
            for statement in [copy, delete] {
                let mut query = sqlx::query(AssertSqlSafe(statement));
                for id in &ids {
                    query = query.bind(id);
                }
                done = query.execute(&mut *tx).await?.rows_affected();
            }
        }
        done += sqlx::query(AssertSqlSafe(self.sql.sweep_history.clone()))
            .bind(micros(params.older_than))
            .bind(i64::from(params.limit))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(done)
    }

    /// The column list of a full read of this table: [`COLUMNS_V4`] on a version-4
    /// table, [`COLUMNS_V2`] on versions 2 and 3, [`COLUMNS`] on version 1.
    pub(crate) async fn columns(&self) -> Result<&'static str> {
        Ok(columns_of(self.schema_version().await?))
    }

    /// The claim's two statements, inside the caller's transaction; never the rows of
    /// `except`: the locking read of the due rows, whole, and their lease. The rows come
    /// back as the read found them with the lease's columns set as the update sets them
    /// (no third statement reads them again).
    async fn claim_on(
        &self,
        conn: &mut MySqlConnection,
        params: &ClaimParams,
        except: &[SetState],
    ) -> Result<Vec<ClaimedRow>> {
        let t = &self.t;
        let ctx = || self.ctx("claiming due commands");
        let version = self.schema_version().await?;
        super::check_queues(version, &self.table, params.queues.as_deref())?;
        let v2 = version >= 2;
        let types = params.types.as_deref().unwrap_or(&[]);
        let queues = params.queues.as_deref();
        let unusable = !v2 || self.unusable.due();
        let hint = self.poll_hint().await?;
        // The cursor follows the poll index's order, so only a claim of every queue and
        // type on a table with icq's poll index (named by the hint) starts after it.
        let follows_cursor = v2 && types.is_empty() && queues.is_none() && !hint.is_empty();
        let after = if follows_cursor {
            self.cursor.start()
        } else {
            None
        };
        let columns = columns_of(version);
        let paused =
            (params.skip_paused && version >= 4).then(|| self.table.queues().quoted(Engine::Mysql));
        let sql = claim_select_sql(
            t,
            &format!("{columns}, {NOW} AS `IcqNow`"),
            &hint,
            v2,
            types.len(),
            queues,
            after.is_some(),
            except.len(),
            unusable,
            paused.as_deref(),
            version >= 4,
        );
        let mut select = sqlx::query(AssertSqlSafe(sql)).bind(micros(params.processing_delay));
        for type_name in types.iter().chain(types) {
            select = select.bind(type_name.clone());
        }
        let queue_list = queues.unwrap_or(&[]);
        for queue in queue_list.iter().chain(queue_list) {
            select = select.bind(queue.clone());
        }
        if let Some((priority, run_at, id)) = after {
            let run_at = run_at.naive_utc();
            select = select
                .bind(priority)
                .bind(priority)
                .bind(run_at)
                .bind(priority)
                .bind(run_at)
                .bind(id.hyphenated().to_string());
        }
        for change in except {
            select = select.bind(change.lease.id.as_str().to_owned());
        }
        let started = std::time::Instant::now();
        let mut rows = select
            .bind(i64::from(params.limit))
            .fetch_all(&mut *conn)
            .await
            .map_err(Error::db(ctx()))?;
        if unusable {
            self.unusable.took(started.elapsed());
        }
        if rows.is_empty() {
            if follows_cursor {
                self.cursor.advance(&[], params.limit, params.spread);
            }
            if after.is_some() && self.cursor.at_head() {
                // Nothing after the cursor (the backlog ends before it, or a spreading
                // jump overshot): from the head at once, where the empty claim moved the
                // cursor (unless the head is costly: the cursor stays). An empty answer
                // makes the processor wait for the polling interval.
                return Box::pin(self.claim_on(conn, params, except)).await;
            }
            return Ok(Vec::new());
        }
        // The two parts of the read may both find a row (a due row whose `Queue` is NULL).
        let mut ids: Vec<String> = Vec::with_capacity(rows.len());
        rows.retain(|row| match row.try_get::<String, _>("Id") {
            Ok(id) if ids.contains(&id) => false,
            Ok(id) => {
                ids.push(id);
                true
            }
            Err(_) => true,
        });
        if !ids.is_empty() {
            let update = format!(
                "UPDATE {t} SET `LockToken` = ?, `LockedUntil` = {NOW} + INTERVAL ? MICROSECOND, \
                 `Attempts` = CASE WHEN `Attempts` BETWEEN 0 AND 2147483646 THEN `Attempts` + 1 \
                 ELSE `Attempts` END WHERE `Id` IN ({})",
                marks(ids.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(update))
                .bind(params.token.to_string())
                .bind(micros(params.lease));
            for id in &ids {
                query = query.bind(id);
            }
            query.execute(&mut *conn).await.map_err(Error::db(ctx()))?;
        }
        let lease = chrono::Duration::from_std(params.lease).unwrap_or(chrono::Duration::MAX);
        // Consumed in order: each raw row is dropped once decoded, so a claim of large
        // payloads never holds every raw row and every decoded one at once.
        let mut claimed = super::leased_rows(
            &self.table,
            params.token,
            rows.into_iter().map(|row| {
                let now = row
                    .try_get::<chrono::NaiveDateTime, _>("IcqNow")
                    .ok()
                    .map(|now| now.and_utc());
                let decoded = decode_row(&row).map(|mut decoded| {
                    leased_as_updated(
                        &mut decoded,
                        params.token,
                        now.and_then(|n| n.checked_add_signed(lease)),
                    );
                    decoded
                });
                (decoded, payload_bytes(&row))
            }),
        );
        claimed.retain(|c| ids.iter().any(|id| id == c.lease.id.as_str()));
        if follows_cursor {
            self.cursor.advance(&claimed, params.limit, params.spread);
        }
        Ok(claimed)
    }

    async fn set_state_on(&self, conn: &mut MySqlConnection, changes: &[SetState]) -> Result<u64> {
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
        // In the caller's transaction (a savepoint) or one of its own.
        let mut tx = sqlx::Connection::begin(&mut *conn)
            .await
            .map_err(Error::db(ctx()))?;
        let done = self.stamp_moving_on(&mut tx, changes, version).await?;
        tx.commit().await.map_err(Error::db(ctx()))?;
        Ok(done)
    }

    /// A claim about to commit `claimed` (see [`UnsettledClaim`]).
    fn unsettled_claim(&self, claimed: &[ClaimedRow], params: &ClaimParams) -> UnsettledClaim {
        if claimed.is_empty() {
            return UnsettledClaim(None);
        }
        let ids: Vec<String> = claimed
            .iter()
            .map(|c| c.lease.id.as_str().to_owned())
            .collect();
        let sql = format!(
            "UPDATE {} SET `LockToken` = NULL, `LockedUntil` = NULL, \
             `Attempts` = GREATEST(`Attempts` - 1, 0) WHERE `LockToken` = ? AND `Id` IN ({})",
            self.t,
            marks(ids.len())
        );
        UnsettledClaim(Some(Release {
            pool: self.pool.clone(),
            sql,
            token: params.token.to_string(),
            ids,
            until: std::time::Instant::now() + params.lease,
        }))
    }

    /// The stamps of a version-3 (or later) table on `conn`, inside a transaction the
    /// caller opened: the set-state statement (on version 4 with the attempts' errors)
    /// for every outcome but a completion, and the move of each completed row to history
    /// (two statements, the row never written in place: a stamp of completions alone is
    /// one statement shorter). Returns how many rows were stamped.
    pub(crate) async fn stamp_moving_on(
        &self,
        conn: &mut MySqlConnection,
        changes: &[SetState],
        version: u32,
    ) -> Result<u64> {
        let ctx = || self.ctx("stamping outcomes");
        let (completions, others): (Vec<&SetState>, Vec<&SetState>) =
            changes.iter().partition(|c| c.kind() == 0);
        let mut stamped = 0;
        if !others.is_empty() {
            let sql = if version >= 4 {
                &self.sql.set_state_v4
            } else {
                &self.sql.set_state_v2
            };
            stamped += sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(stamps_json(others))
                .execute(&mut *conn)
                .await
                .map_err(Error::db(ctx()))?
                .rows_affected();
        }
        if !completions.is_empty() {
            let json = stamps_json(completions);
            let copy = &self.sql.copy_completing[usize::from(version >= 4)];
            sqlx::query(AssertSqlSafe(copy.clone()))
                .bind(json.clone())
                .execute(&mut *conn)
                .await
                .map_err(Error::db(ctx()))?;
            stamped += sqlx::query(AssertSqlSafe(self.sql.delete_completing.clone()))
                .bind(json)
                .execute(&mut *conn)
                .await
                .map_err(Error::db(ctx()))?
                .rows_affected();
        }
        Ok(stamped)
    }
}

#[async_trait]
impl QueueOps for MySqlDriver {
    /// Two: four replicas with four claims each drained at 0.61× one replica (InnoDB's
    /// `SKIP LOCKED` claims contend on the same index range), two claims each at 0.96×.
    fn claims_in_flight(&self) -> usize {
        2
    }

    async fn command_insert(&self, params: &CommandInsertParams<'_>) -> Result<Scheduled> {
        let command = params.command;
        let version = if command.uses_v2_columns() {
            self.schema_version().await?
        } else {
            1
        };
        let inserts = self.inserts();
        again_after_lost_races(|| async {
            let mut conn = self
                .pool
                .acquire()
                .await
                .map_err(Error::db(self.ctx("scheduling a command")))?;
            insert_one(&mut conn, &inserts, &self.table, command, version).await
        })
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
        let inserts = self.inserts();
        again_after_lost_races(|| async {
            let mut tx = self.pool.begin().await.map_err(Error::db(ctx()))?;
            let scheduled =
                insert_many(&mut tx, &inserts, &self.t, &self.table, commands, version).await?;
            tx.commit().await.map_err(Error::db(ctx()))?;
            Ok(scheduled)
        })
        .await
    }

    async fn command_claim(&self, params: &ClaimParams) -> Result<Vec<ClaimedRow>> {
        let ctx = || self.ctx("claiming due commands");
        self.schema_version().await?;
        let mut conn = self.pool.acquire().await.map_err(Error::db(ctx()))?;
        let mut tx = conn.begin().await.map_err(Error::db(ctx()))?;
        let claimed = self.claim_on(&mut tx, params, &[]).await?;
        let unsettled = self.unsettled_claim(&claimed, params);
        let committed = tx.commit().await;
        unsettled.settled(committed.as_ref().err());
        committed.map_err(Error::db(ctx()))?;
        Ok(claimed)
    }

    async fn command_set_state_and_claim(
        &self,
        params: &CommandSetStateAndClaimParams<'_>,
    ) -> Result<(u64, Vec<ClaimedRow>)> {
        let (changes, params) = (params.changes, params.claim);
        // Looked up (and remembered) before the transaction takes a connection: a pool
        // of one would otherwise wait on itself.
        self.schema_version().await?;
        let ctx = || self.ctx("stamping outcomes and claiming due commands");
        let mut conn = self.pool.acquire().await.map_err(Error::db(ctx()))?;
        let mut tx = conn.begin().await.map_err(Error::db(ctx()))?;
        let stamped = self.set_state_on(&mut tx, changes).await?;
        let claimed = self.claim_on(&mut tx, params, changes).await?;
        let unsettled = self.unsettled_claim(&claimed, params);
        let committed = tx.commit().await;
        unsettled.settled(committed.as_ref().err());
        committed.map_err(Error::db(ctx()))?;
        Ok((stamped, claimed))
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
            "SELECT {} FROM {} WHERE `Id` = ?",
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
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(Error::db(self.ctx("stamping outcomes")))?;
        let stamped = self.set_state_on(&mut conn, changes).await?;
        Ok(stamped)
    }

    async fn lease_extend_many(&self, params: &LeaseExtendManyParams) -> Result<Vec<Lease>> {
        let (leases, lease) = (params.leases.as_slice(), params.lease);
        let ctx = || self.ctx("extending leases");
        let json = leases_json(leases.iter().map(|l| (l, 0, -1, None, None)));
        let mut conn = self.pool.acquire().await.map_err(Error::db(ctx()))?;
        sqlx::query(AssertSqlSafe(self.sql.extend.clone()))
            .bind(&json)
            .bind(micros(lease))
            .execute(&mut *conn)
            .await
            .map_err(Error::db(ctx()))?;
        // No UPDATE … RETURNING here: the rows that still carry their token are held.
        let rows = sqlx::query(AssertSqlSafe(self.sql.extended.clone()))
            .bind(&json)
            .fetch_all(&mut *conn)
            .await
            .map_err(Error::db(ctx()))?;
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
        let ctx = || self.ctx("deleting old completed commands");
        let lock = format!("icq.sweep.{:016x}", fnv1a(&self.t));
        let mut conn = self.pool.acquire().await.map_err(Error::db(ctx()))?;
        // One replica sweeps at a time: the others skip the round. `GET_LOCK` names are
        // server-wide, so the name carries the database too: tables of one name in two
        // databases of one server (two applications, or two tests) must not take turns.
        let locked: Option<i64> = sqlx::query_scalar(SWEEP_LOCK)
            .bind(&lock)
            .bind(self.table.schema())
            .fetch_one(&mut *conn)
            .await
            .map_err(Error::db(ctx()))?;
        if locked != Some(1) {
            return Ok(None);
        }
        let version = self.schema_version().await?;
        let done = if version >= 3 {
            self.sweep_v3(&mut conn, params, version).await
        } else {
            sqlx::query(AssertSqlSafe(self.sql.sweep.clone()))
                .bind(micros(params.older_than))
                .bind(i64::from(params.limit))
                .execute(&mut *conn)
                .await
                .map(|done| done.rows_affected())
        };
        let released = sqlx::query(SWEEP_UNLOCK)
            .bind(&lock)
            .bind(self.table.schema())
            .execute(&mut *conn)
            .await;
        let done = done.map_err(Error::db(ctx()))?;
        released.map_err(Error::db(ctx()))?;
        Ok(Some(done))
    }

    async fn activity(&self) -> Result<Activity> {
        let hint = self.poll_hint().await?;
        let sql = if hint.is_empty() {
            self.sql.activity.clone()
        } else {
            activity_sql(&format!("{}{hint}", self.t), "").into()
        };
        let row = sqlx::query(AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting due commands")))?;
        super::decode_activity(&row)
    }

    async fn activity_unpaused(&self) -> Result<Activity> {
        if self.schema_version().await? < 4 {
            return self.activity().await;
        }
        let paused = paused_filter(&self.t, &self.table.queues().quoted(Engine::Mysql));
        let row = sqlx::query(AssertSqlSafe(activity_sql(&self.t, &paused)))
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
        let list = if queues.is_empty() {
            "NULL".to_owned()
        } else {
            marks(queues.len())
        };
        let exact_list = if queues.is_empty() {
            "NULL".to_owned()
        } else {
            exact_marks(queues.len())
        };
        let sql = activity_sql(
            &self.t,
            &format!(
                " AND ((`Queue` IN ({list}) AND {} IN ({exact_list})) OR `Queue` IS NULL)",
                exact("`Queue`")
            ),
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for queue in queues.iter().chain(queues) {
            query = query.bind(queue.clone());
        }
        let row = query
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting due commands")))?;
        super::decode_activity(&row)
    }

    async fn lease_check_many(&self, params: &LeaseCheckManyParams) -> Result<Vec<Lease>> {
        if params.leases.is_empty() {
            return Ok(Vec::new());
        }
        let json = leases_json(params.leases.iter().map(|l| (l, 0, -1, None, None)));
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
            "`Priority`, `RunAt`"
        } else {
            "`RunAt`"
        };
        let sql = format!(
            "SELECT CAST(COUNT(*) AS SIGNED) AS others FROM ( \
                   SELECT `LockToken`, `LockedUntil` FROM {t} \
                   WHERE `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL AND `RunAt` <= {now} \
                   ORDER BY {order} LIMIT ?) AS head \
               WHERE head.`LockedUntil` > {now} AND NOT (head.`LockToken` BETWEEN ? AND ?)",
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
impl BenchOps for MySqlDriver {
    async fn bench_fill_completed(&self, params: &BenchFillCompletedParams) -> Result<()> {
        let rows = params.rows;
        // MariaDB caps recursive CTEs at 1000 iterations by default, so the rows come from
        // a cross join of five ten-row tables (100,000 rows a statement at most).
        const PER_STATEMENT: u64 = 100_000;
        let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
             UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
             UNION ALL SELECT 8 UNION ALL SELECT 9)";
        let sql: Arc<str> = format!(
            "INSERT INTO {} (`Id`, `Type`, `Payload`, `CreatedAt`, `RunAt`, `Attempts`, `ProcessedAt`) \
             SELECT UUID(), 'bench.retained', '{{}}', {NOW}, {NOW}, 1, {NOW} \
             FROM {digits} AS a CROSS JOIN {digits} AS b CROSS JOIN {digits} AS c \
             CROSS JOIN {digits} AS d CROSS JOIN {digits} AS e LIMIT ?",
            self.t
        )
        .into();
        let mut left = rows;
        while left > 0 {
            let n = left.min(PER_STATEMENT);
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(n)
                .execute(&self.pool)
                .await
                .map_err(Error::db(
                    self.ctx("inserting completed rows for the benchmark"),
                ))?;
            left -= n;
        }
        Ok(())
    }
}

#[async_trait]
impl Lifecycle for MySqlDriver {
    fn engine(&self) -> Engine {
        Engine::Mysql
    }

    fn table(&self) -> &TableName {
        &self.table
    }

    async fn table_exists(&self) -> Result<bool> {
        let found: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?",
        )
        .bind(self.table.schema())
        .bind(self.table.name())
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
                let (queue, history, order_key): (i64, i64, i64) = sqlx::query_as(
                    "SELECT (SELECT COUNT(*) FROM information_schema.columns \
                             WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? \
                               AND column_name = 'Queue'), \
                            (SELECT COUNT(*) FROM information_schema.tables \
                             WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?), \
                            (SELECT COUNT(*) FROM information_schema.columns \
                             WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? \
                               AND column_name = 'OrderKey')",
                )
                .bind(self.table.schema())
                .bind(self.table.name())
                .bind(self.table.schema())
                .bind(self.table.history().name().to_owned())
                .bind(self.table.schema())
                .bind(self.table.name())
                .fetch_one(&self.pool)
                .await
                .map_err(Error::db(self.ctx("looking up the table's schema version")))?;
                Ok(Some(super::version_of(
                    queue > 0,
                    history > 0,
                    order_key > 0,
                )))
            })
            .await
    }

    fn forget_schema_version(&self) {
        self.version.forget();
    }

    async fn schema_apply(&self, ddl: &str) -> Result<()> {
        self.version.forget();
        super::run_script(
            &self.pool,
            ddl.to_owned(),
            self.ctx("creating the commands table"),
        )
        .await
    }

    async fn listen(
        &self,
        _notify: Arc<Notify>,
        _cancelled: Arc<Notify>,
        _queues_changed: Arc<Notify>,
    ) -> Result<bool> {
        Ok(false)
    }

    async fn close(&self) {
        if let Some(failover) = &self.failover {
            failover.stop();
        }
        if !self.shared_pool {
            self.pool.close().await;
        }
    }

    async fn table_drop(&self, down: &str) -> Result<()> {
        self.version.forget();
        super::run_script(&self.pool, down.to_owned(), self.ctx("dropping the table")).await
    }
}

// What the embedding API takes of this engine: its pools ([`crate::Queue::from_pool`],
// [`crate::schema::apply`]) and its connections ([`crate::Enqueue`]).

impl super::sealed::Database for sqlx::MySql {
    async fn driver(pool: &MySqlPool, table: &TableName) -> Result<Arc<dyn super::Backend>> {
        Ok(Arc::new(MySqlDriver::from_pool(pool.clone(), table).await?))
    }
}

impl super::sealed::Connection for MySqlConnection {}

#[async_trait]
impl crate::Enqueue for MySqlConnection {
    fn engine(&self) -> Engine {
        Engine::Mysql
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

/// Needs the MariaDB server, like the driver conformance suite: built with it.
#[cfg(all(test, feature = "driver-suite"))]
mod tests {
    use sqlx::Connection;

    use super::*;
    use crate::engine::{CommandInsertManyParams, CommandInsertParams, QueueOps, SweepParams};

    fn server() -> String {
        std::env::var("ICQ_TEST_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
    }

    /// A driver on a new, empty version-2 table named `<prefix>_<pid>`.
    async fn fresh_table(prefix: &str) -> (TableName, MySqlDriver) {
        let table = TableName::parse(&format!("{prefix}_{}", std::process::id())).unwrap();
        let driver = MySqlDriver::connect(&server(), &table, &ConnectOptions::default())
            .await
            .expect("MariaDB test server");
        driver
            .table_drop(&crate::schema::render(Engine::Mysql, &table).down)
            .await
            .unwrap();
        driver
            .schema_apply(&crate::schema::render(Engine::Mysql, &table).up)
            .await
            .unwrap();
        (table, driver)
    }

    /// Issues 19 and 21: a claim of every queue starts after the last row this driver
    /// claimed (one seek past the rows it holds and the delete-marked entries completed
    /// rows leave behind), in claim order; one that finds nothing after the cursor goes on
    /// from the head, which finds a row released behind the cursor.
    #[tokio::test]
    async fn claims_of_every_queue_follow_the_cursor() {
        // The cursor goes back to the head every HEAD_SCAN_EVERY: on a machine too busy to
        // make the claims within it, try again on a fresh table.
        for attempt in 0..5 {
            if cursor_scenario(attempt).await {
                return;
            }
        }
        panic!("five tries each took longer than the cursor lasts");
    }

    /// One try of the test above: false when it ran too slowly to say anything.
    async fn cursor_scenario(attempt: u32) -> bool {
        let (_table, driver) = fresh_table(&format!("cursor{attempt}")).await;
        let t = &driver.t;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {t} (`Type`, `Payload`) SELECT 'bulk', '{{}}' FROM seq_1_to_60"
        )))
        .execute(&driver.pool)
        .await
        .unwrap();
        let claim = || ClaimParams {
            limit: 20,
            lease: Duration::from_secs(30),
            processing_delay: Duration::ZERO,
            token: crate::command::LeaseToken::owned_by(uuid::Uuid::new_v4()),
            types: None,
            queues: None,
            spread: false,
            skip_paused: false,
        };
        let order: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT `Id` FROM {t} ORDER BY `Priority`, `RunAt`, `Id`"
        )))
        .fetch_all(&driver.pool)
        .await
        .unwrap();
        let ids = |rows: &[ClaimedRow]| {
            let mut ids: Vec<String> = rows.iter().map(|r| r.lease.id.to_string()).collect();
            ids.sort();
            ids
        };
        let sorted = |range: std::ops::Range<usize>| {
            let mut ids = order[range].to_vec();
            ids.sort();
            ids
        };
        let started = std::time::Instant::now();
        let first = driver.command_claim(&claim()).await.unwrap();
        assert_eq!(ids(&first), sorted(0..20));
        // Released behind the cursor: the next claims go on after it, not back to it.
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {t} SET `LockToken` = NULL, `LockedUntil` = NULL WHERE `Id` = ?"
        )))
        .bind(&order[0])
        .execute(&driver.pool)
        .await
        .unwrap();
        let second = driver.command_claim(&claim()).await.unwrap();
        let third = driver.command_claim(&claim()).await.unwrap();
        let after = driver.command_claim(&claim()).await.unwrap();
        if started.elapsed() >= cursor::HEAD_SCAN_EVERY * 4 / 5 {
            return false;
        }
        assert_eq!(ids(&second), sorted(20..40));
        assert_eq!(ids(&third), sorted(40..60));
        // Nothing after the cursor: the same claim goes on from the head at once (an empty
        // answer would make the processor wait for the polling interval).
        assert_eq!(ids(&after), vec![order[0].clone()]);
        true
    }

    /// icq's own sessions run at READ COMMITTED (on a server without a
    /// statement-based binary log, like this one), so a claim lets go of the leased rows
    /// it steps over instead of holding them until it commits.
    #[tokio::test]
    async fn own_sessions_claim_at_read_committed() {
        let table = TableName::parse("isolation_probe").unwrap();
        let driver = MySqlDriver::connect(&server(), &table, &ConnectOptions::default())
            .await
            .expect("MariaDB test server");
        let mut conn = driver.pool.acquire().await.unwrap();
        let (log_bin, format): (i64, String) = sqlx::query_as("SELECT @@log_bin, @@binlog_format")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert!(
            log_bin == 0 || format != "STATEMENT",
            "the test server logs statements"
        );
        for _ in 0..2 {
            let level: String = sqlx::query_scalar("SELECT @@session.tx_isolation")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            assert_eq!(level, "READ-COMMITTED");
            let mut tx = driver.pool.begin().await.unwrap();
            let level: String = sqlx::query_scalar("SELECT @@session.tx_isolation")
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            assert_eq!(level, "READ-COMMITTED", "inside a transaction");
            tx.rollback().await.unwrap();
        }
    }

    /// A payload larger than the server's `max_allowed_packet` is refused
    /// before it is sent, naming the limit and the variable, and nothing is written (the
    /// server would drop the connection: "Connection reset by peer"). A batch of large
    /// payloads that fit one by one is split into statements that fit.
    #[tokio::test]
    async fn a_payload_over_max_allowed_packet_is_refused_by_name() {
        let (table, driver) = fresh_table("packet").await;
        let limit: u64 = sqlx::query_scalar("SELECT @@max_allowed_packet")
            .fetch_one(&driver.pool)
            .await
            .unwrap();
        let payload = |bytes: u64| serde_json::Value::String("x".repeat(bytes as usize));
        let count = || async {
            let n: i64 =
                sqlx::query_scalar(AssertSqlSafe(format!("SELECT COUNT(*) FROM {}", driver.t)))
                    .fetch_one(&driver.pool)
                    .await
                    .unwrap();
            n
        };

        let big = NewCommand::new("reports.render", payload(limit + (4 << 20)));
        let err = driver
            .command_insert(&CommandInsertParams { command: &big })
            .await
            .unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, Error::Invalid { .. }), "{err:?}");
        assert!(message.contains("max_allowed_packet"), "{message}");
        assert!(message.contains(&format!("({limit} bytes)")), "{message}");
        assert!(message.contains("nothing was scheduled"), "{message}");
        assert!(!message.contains("reset by peer"), "{message}");
        // The same through a caller's transaction, and with a unique key.
        let mut tx = driver.pool.begin().await.unwrap();
        let keyed = big.clone().unique_key("k");
        let err = insert_command(&mut tx, &table, &keyed).await.unwrap_err();
        assert!(err.to_string().contains("max_allowed_packet"), "{err}");
        tx.rollback().await.unwrap();
        assert_eq!(count().await, 0, "nothing was written");

        // Three payloads of about 40% of the limit each: two statements, all written.
        let third: Vec<NewCommand> = (0..3)
            .map(|_| NewCommand::new("reports.render", payload(limit * 2 / 5)))
            .collect();
        let done = driver
            .command_insert_many(&CommandInsertManyParams { commands: &third })
            .await
            .unwrap();
        assert_eq!(done.len(), 3);
        assert_eq!(count().await, 3);
        // The pool's connections are still good.
        let small = NewCommand::new("reports.render", serde_json::json!({"n": 1}));
        driver
            .command_insert(&CommandInsertParams { command: &small })
            .await
            .unwrap();
        driver
            .table_drop(&crate::schema::render(Engine::Mysql, &table).down)
            .await
            .unwrap();
        driver.close().await;
    }

    /// Two databases of one server with a table of one name each: a replica sweeping one
    /// never makes the other skip its rounds (`GET_LOCK` names are server-wide).
    #[tokio::test]
    async fn the_sweep_lock_is_per_database() {
        let base = server();
        let mut admin = sqlx::MySqlConnection::connect(&base)
            .await
            .expect("MariaDB test server");
        let table = TableName::parse(&format!("sweeplock_{}", std::process::id())).unwrap();
        let mut drivers = Vec::new();
        for n in 0..2 {
            let db = format!("icqt_sweeplock_{}_{n}", std::process::id());
            sqlx::raw_sql(AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS `{db}`; CREATE DATABASE `{db}`"
            )))
            .execute(&mut admin)
            .await
            .unwrap();
            let mut url = url::Url::parse(&base).unwrap();
            url.set_path(&format!("/{db}"));
            let driver = MySqlDriver::connect(url.as_str(), &table, &ConnectOptions::default())
                .await
                .unwrap();
            driver
                .schema_apply(&crate::schema::render(Engine::Mysql, &table).up)
                .await
                .unwrap();
            drivers.push((db, url, driver));
        }
        // Another replica of the first database is sweeping: it holds that lock.
        let mut holder = sqlx::MySqlConnection::connect(drivers[0].1.as_str())
            .await
            .unwrap();
        let lock = format!("icq.sweep.{:016x}", fnv1a(&drivers[0].2.t));
        let held: Option<i64> = sqlx::query_scalar(SWEEP_LOCK)
            .bind(&lock)
            .bind(None::<String>)
            .fetch_one(&mut holder)
            .await
            .unwrap();
        assert_eq!(held, Some(1));
        let params = SweepParams {
            older_than: Duration::from_secs(86_400),
            limit: 10,
        };
        assert_eq!(
            drivers[0].2.completed_delete_batch(&params).await.unwrap(),
            None
        );
        assert_eq!(
            drivers[1].2.completed_delete_batch(&params).await.unwrap(),
            Some(0),
            "the other database's sweep waited for this one's lock"
        );
        holder.close().await.unwrap();
        for (db, _, driver) in drivers {
            driver.close().await;
            sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE `{db}`")))
                .execute(&mut admin)
                .await
                .unwrap();
        }
    }

    /// `PollQueue` is the queue of a pending row outside 'default' and NULL
    /// otherwise, so completing a default-queue row writes nothing to the queue poll
    /// index; a claim of named queues seeks that index, one listing 'default' reads the
    /// poll index; both claim only their queues' rows, in priority order.
    #[tokio::test]
    async fn queue_claims_seek_the_queue_poll_index() {
        let (table, driver) = fresh_table("pollq").await;
        let t = &driver.t;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {t} (`Type`, `Payload`) SELECT 'bulk', '{{}}' FROM seq_1_to_300"
        )))
        .execute(&driver.pool)
        .await
        .unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {t} (`Type`, `Payload`, `Queue`, `Priority`) VALUES \
             ('hook', '{{}}', 'webhooks', 5), ('hook', '{{}}', 'webhooks', -1), \
             ('mail', '{{}}', 'mail', 0)"
        )))
        .execute(&driver.pool)
        .await
        .unwrap();
        let keys: Vec<(String, Option<String>)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT DISTINCT `Queue`, CONVERT(`PollQueue` USING utf8mb4) FROM {t} ORDER BY `Queue`"
        )))
        .fetch_all(&driver.pool)
        .await
        .unwrap();
        assert_eq!(
            keys,
            vec![
                ("default".into(), None),
                ("mail".into(), Some("mail".into())),
                ("webhooks".into(), Some("webhooks".into()))
            ]
        );
        sqlx::query(AssertSqlSafe(format!("ANALYZE TABLE {t}")))
            .execute(&driver.pool)
            .await
            .unwrap();

        let webhooks = vec!["webhooks".to_owned()];
        let sql = claim_select_sql(
            t,
            "`Id`",
            "",
            true,
            0,
            Some(&webhooks),
            false,
            0,
            false,
            None,
            false,
        );
        let plan: Vec<sqlx::mysql::MySqlRow> = sqlx::query(AssertSqlSafe(format!("EXPLAIN {sql}")))
            .bind(0_i64)
            .bind("webhooks")
            .bind("webhooks")
            .bind(50_i64)
            .fetch_all(&driver.pool)
            .await
            .unwrap();
        let key: Option<String> = plan[0].try_get("key").unwrap();
        assert_eq!(
            key.as_deref(),
            Some(format!("IX_{}_QueuePoll", table.name()).as_str())
        );

        let claim = |queues: &[&str]| ClaimParams {
            limit: 10,
            lease: Duration::from_secs(30),
            processing_delay: Duration::ZERO,
            token: crate::command::LeaseToken::owned_by(uuid::Uuid::new_v4()),
            types: None,
            queues: Some(queues.iter().map(|q| q.to_string()).collect()),
            spread: false,
            skip_paused: false,
        };
        let rows = driver.command_claim(&claim(&["webhooks"])).await.unwrap();
        let mut priorities: Vec<i16> = rows.iter().map(|r| r.row.priority).collect();
        priorities.sort();
        assert_eq!(priorities, vec![-1, 5]);
        assert!(rows.iter().all(|r| r.row.queue == "webhooks"));
        let rows = driver
            .command_claim(&claim(&["default", "mail"]))
            .await
            .unwrap();
        assert_eq!(rows.len(), 10);
        assert!(
            rows.iter()
                .all(|r| r.row.queue == "default" || r.row.queue == "mail")
        );

        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {t} SET `ProcessedAt` = UTC_TIMESTAMP(6) WHERE `Queue` = 'webhooks'"
        )))
        .execute(&driver.pool)
        .await
        .unwrap();
        let left: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {t} WHERE `PollQueue` = 'webhooks'"
        )))
        .fetch_one(&driver.pool)
        .await
        .unwrap();
        assert_eq!(left, 0, "a completed row leaves the queue poll index's key");
        driver
            .table_drop(&crate::schema::render(Engine::Mysql, &table).down)
            .await
            .unwrap();
    }
}
