//! PostgreSQL: every statement icq runs against a PostgreSQL source.
//!
//! Claims use `FOR UPDATE SKIP LOCKED` so replicas never wait on each other; outcome
//! stamps take arrays (`unnest`) so a whole batch is one statement; wake-ups come from the
//! migration's statement-level trigger through `LISTEN`. Which server, through what
//! pooler, and finding the writable one again after a failover: [`connect`].

/// Runs `$run` (`|e| query.fetch_all(e)`) on `$pool`: directly, or, behind a transaction
/// pooler (`pooler: transaction`), inside its own transaction opened by `$begin`, so
/// the parse and the execution that sqlx sends in two round trips reach one server
/// connection. Yields `Result<_, sqlx::Error>`.
macro_rules! on_pool {
    ($driver:expr, $pool:expr, $begin:expr, |$e:ident| $run:expr) => {
        async {
            if $driver.pooler == crate::settings::Pooler::Transaction {
                let mut tx = $pool.begin_with($begin).await?;
                let out = {
                    let $e = &mut *tx;
                    $run.await?
                };
                tx.commit().await?;
                Ok::<_, sqlx::Error>(out)
            } else {
                let $e = &$pool;
                $run.await
            }
        }
    };
}

/// Runs `$run` on the driver's work pool with [`WORK_SESSION`]'s settings whichever way
/// the driver was made: on icq's own connections the session carries them ([`connect`]);
/// on the application's pool, or behind a transaction pooler, the statement runs in a
/// transaction of its own that sets them `LOCAL`, so no other statement of the
/// application's, and no other server connection, is touched.
macro_rules! on_work {
    ($driver:expr, |$e:ident| $run:expr) => {
        async {
            if $driver.work_in_transaction() {
                let mut tx = $driver.work.begin_with(WORK_BEGIN).await?;
                let out = {
                    let $e = &mut *tx;
                    $run.await?
                };
                tx.commit().await?;
                Ok::<_, sqlx::Error>(out)
            } else {
                let $e = &$driver.work;
                $run.await
            }
        }
    };
}

mod admin;
mod connect;
mod control;
mod doctor;
mod limited;
mod recurring;
use super::cursor;

pub(crate) use connect::{connect_options, login_refusal};

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnection, PgListener, PgPool, PgRow};
use sqlx::{AssertSqlSafe, Row, ValueRef};
use tokio::sync::Notify;
use uuid::Uuid;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgValueFormat;

use super::decode::{Decoder, text_columns};
use super::{
    Activity, BenchFillCompletedParams, BenchOps, ClaimParams, ClaimedRow, CommandGetParams,
    CommandInsertManyParams, CommandInsertParams, CommandSetStateAndClaimParams,
    CommandSetStateManyParams, ConnectOptions, Lease, LeaseCheckManyParams, LeaseExtendManyParams,
    LeaseOthersAtHeadParams, Lifecycle, QueueOps, SetState, SweepParams,
};
use crate::command::{CommandId, CommandRow, LeaseToken, NewCommand, RunAt, Scheduled};
use crate::error::{Error, Result};
use crate::ident::{Engine, TableName};
use crate::redact::redact_url;
use crate::settings::Pooler;

/// How the processor's own statements begin where the connection's session cannot carry
/// [`WORK_SESSION`]'s settings: on the application's pool (its other statements stay as
/// it set them) and in transaction pooling (the next transaction may run on another
/// server connection).
const WORK_BEGIN: &str =
    "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL jit = off";

/// The session settings of icq's own work connections (claims, stamps, renewals, sweeps):
/// `plan_cache_mode = force_generic_plan` and `jit = off`. The claim's parameters
/// (`LIMIT $1`, the queue, the cursor) never change which index serves it, but left to
/// choose, the server compares the generic plan, costed for an unknown `LIMIT` as a tenth
/// of the table, with plans for the actual 50 rows; with the ordered-key subquery priced
/// per row that comparison never favours the generic plan, so every claim was planned
/// again (half a millisecond each, a tenth of a no-op drain). The generic plans use the
/// same indexes as the custom ones, on a table of any size.
///
/// That costing grows with the backlog, and the server compiles every plan costed above
/// `jit_above_cost` to machine code (LLVM) at each execution: tens of milliseconds for a
/// claim that runs in a fraction of one. With the ordered-key subquery priced per row a
/// backlog of about 120,000 rows crossed the default threshold, and without it a few
/// million; no statement of the processor's reads enough rows for compiled code to pay.
///
/// Commits keep the server's `synchronous_commit`: a claim or a stamp the server
/// acknowledged is on its synchronous standby too, so a failover to it runs no command
/// twice.
const WORK_SESSION: &str = "SET plan_cache_mode = force_generic_plan; SET jit = off";

/// How every other statement begins in transaction pooling.
const BEGIN: &str = "BEGIN";

/// A PostgreSQL source: its pool, table and prepared SQL text.
pub struct PgDriver {
    pub(crate) pool: PgPool,
    /// The processor's connections: claims, stamps, lease renewals and sweeps, with
    /// generic plans ([`WORK_SESSION`]) however the driver was made ([`on_work!`]);
    /// schedules and operator changes go through `pool`. Both commit with the server's
    /// `synchronous_commit`.
    work: PgPool,
    pub(crate) table: TableName,
    /// The quoted, possibly schema-qualified table name.
    pub(crate) t: String,
    /// The quoted name of its history table (schema version 3).
    pub(crate) h: String,
    /// Which server of the URL is in use, and the watcher that moves to another.
    failover: Arc<connect::Failover>,
    /// The pooler in front of the server (the source's `pooler` setting).
    pooler: Pooler,
    sql: Sql,
    /// Where the next unfiltered claim starts in the poll index.
    cursor: cursor::ClaimCursor,
    /// When a claim last looked for rows no claim in priority order settles.
    unusable: super::UnusableGate,
    /// The table's schema version, once looked up.
    version: super::SchemaVersionCache,
    listener: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The pool is the application's ([`PgDriver::from_pool`]): closing the driver leaves
    /// it open.
    shared_pool: bool,
    /// The database stores text in an encoding other than UTF-8 (`LATIN1`, ...): error
    /// texts are written with every non-ASCII character escaped, since one the encoding
    /// lacks (a handler's `€`) would fail the whole stamp, forever.
    ascii_errors: std::sync::atomic::AtomicBool,
}

/// The statements of the queue path, rendered once per table. `Arc<str>` so a query
/// borrows them without copying; sqlx prepares each once per connection.
struct Sql {
    /// The insert naming the version-1 columns (a command without queue, priority,
    /// unique key or trace parent: the others take their defaults on a version-2 table).
    insert: Arc<str>,
    /// The insert naming the version-2 columns, `ON CONFLICT` on the unique key.
    insert_v2: Arc<str>,
    /// `insert_v2` naming the order and concurrency keys too (schema version 4).
    insert_v4: Arc<str>,
    /// The pending row holding a unique key.
    pending_by_key: Arc<str>,
    /// The set-state statements of schema versions 1 to 4, in that order: version 1 has
    /// no `Snoozes`; from version 3 completed rows move to history; on version 4 the
    /// moves carry its columns, and a failure also writes `Errors` (a sixth array).
    set_state: [StampSql; 4],
    /// A version-3 sweep's move of completed rows found in the table (`$1` limit).
    sweep_move: Arc<str>,
    /// `sweep_move` of a version-4 table.
    sweep_move_v4: Arc<str>,
    /// A version-3 sweep's delete of old history (`$1` seconds, `$2` limit).
    sweep_history: Arc<str>,
    extend: Arc<str>,
    check: Arc<str>,
    sweep: Arc<str>,
    activity: Arc<str>,
    /// `activity` of a version-1 table (no `Priority`).
    activity_v1: Arc<str>,
    /// `activity` of a version-2 table's queues (`$1` text[]).
    activity_in: Arc<str>,
    /// The bulk insert's statements.
    bulk: BulkSql,
    /// Claims and stamp-and-claims, by shape.
    claims: super::SqlCache<ClaimKey>,
    /// A limited queue's hand-on, rendered at its first use.
    hand_on: std::sync::OnceLock<Arc<str>>,
}

/// The shape of a claim statement: what it filters on, where it starts, whether the
/// stamps come first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ClaimKey {
    /// A version-2 table: `Priority`, `RunAt`, `Id` order.
    v2: bool,
    /// A version-3 table: the stamps move completed rows to history.
    history: bool,
    /// A version-4 table: the moves carry its columns too.
    v4: bool,
    /// Stamps first (`$5..$9`, `$5..$10` on version 4), so the filters start at `$10`
    /// (`$11`).
    stamp: bool,
    /// `"Type" = ANY(…)`.
    types: bool,
    queues: super::QueueFilter,
    /// Starts after a [`cursor::Position`].
    after: bool,
    /// Skips rows of paused queues (a version-4 table with a queue paused).
    paused: bool,
    /// Also takes a few pending rows no time makes due (NULL `RunAt`, NULL `Queue`):
    /// every claim on a version-1 table, now and then on version 2 (seeks on both:
    /// [`unusable_sql`]).
    unusable: bool,
}

impl ClaimKey {
    /// The schema version of the table the key is for.
    fn version(self) -> u32 {
        match (self.v4, self.history, self.v2) {
            (true, _, _) => 4,
            (_, true, _) => 3,
            (_, _, true) => 2,
            _ => 1,
        }
    }
}

/// How many of `changes` a stamp carries: those whose id is a UUID (the stamp arrays
/// leave out any other, which no row of a PostgreSQL table can have).
fn stampable(changes: &[SetState]) -> u64 {
    changes
        .iter()
        .filter(|c| c.lease.id.as_uuid().is_some())
        .count() as u64
}

/// Claim order, the poll index's columns (version 1 has no `Priority`).
fn poll_order(v2: bool) -> &'static str {
    if v2 {
        r#""Priority", "RunAt", "Id""#
    } else {
        r#""RunAt", "Id""#
    }
}

/// The claim's selection: `due`, the due prefix in claim order, skipping rows other
/// claimers hold (`$1` limit, `$3` processing delay; `filter` may add more), and, when
/// `key.unusable`, the CTEs of [`unusable_sql`].
fn due_sql(t: &str, key: ClaimKey, filter: &str) -> String {
    let order = poll_order(key.v2);
    let paused = if key.paused {
        paused_filter(t)
    } else {
        String::new()
    };
    let unusable = if key.unusable {
        unusable_sql(t, key.v2)
    } else {
        String::new()
    };
    format!(
        r#"due AS (
           SELECT ctid, "Id" FROM {t}
           WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL
             AND "RunAt" <= now()
             AND ("LockedUntil" IS NULL OR "LockedUntil" <= now())
             AND ("CreatedAt" <= now() - make_interval(secs => $3) OR "CreatedAt" IS NULL){filter}{paused}
           ORDER BY {order}
           LIMIT $1
           FOR UPDATE SKIP LOCKED){unusable}"#
    )
}

/// Leaves out rows of queues paused in the queue-state table of `t` (`<table>Queues`,
/// whose quoted name is `t`'s with `Queues` before the closing quote): one primary-key
/// probe of a small table per row looked at, made only while some queue is paused.
fn paused_filter(t: &str) -> String {
    let q = format!("{}Queues\"", &t[..t.len() - 1]);
    format!(
        r#"
             AND NOT EXISTS (SELECT 1 FROM {q} AS p WHERE p."Queue" = {t}."Queue" AND p."Paused")"#
    )
}

/// A few pending rows no time makes due (NULL `RunAt`) or, on version 2, no queue filter
/// matches (NULL `Queue`): another program's migration relaxed NOT NULL. They are
/// claimed as they are and the executor dead-letters them naming the column. A NULL
/// `CreatedAt` is no reason to wait either.
///
/// Every look is a seek, never a scan of the table (which every replica made every
/// [`super::UNUSABLE_EVERY`], reading the whole table each time: 25–50 ms of the
/// server's time per look into a 50,000-row drain). On version 1 NULL `RunAt`s sort last
/// in the poll index (`RunAt`, `Id`). On version 2 a NULL `Queue` sorts last in the queue
/// poll index (`Queue`, …); a NULL `RunAt` sorts last within its priority in the poll
/// index (`Priority`, `RunAt`, `Id`), so the look walks the priorities present (`prios`,
/// one descent each: a loose index scan) and seeks the NULLs of each, and of a NULL
/// priority. The statement needs `WITH RECURSIVE` then ([`with_clause`]).
fn unusable_sql(t: &str, v2: bool) -> String {
    let pending = r#""ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#;
    let free = r#"("LockedUntil" IS NULL OR "LockedUntil" <= now())"#;
    if !v2 {
        return format!(
            r#",
           unusable AS (
           SELECT ctid, "Id" FROM {t}
           WHERE {pending} AND "RunAt" IS NULL AND {free}
           LIMIT 10
           FOR UPDATE SKIP LOCKED)"#
        );
    }
    format!(
        r#",
           prios(p) AS (
           (SELECT "Priority" FROM {t} WHERE {pending} AND "Priority" IS NOT NULL
            ORDER BY "Priority" LIMIT 1)
           UNION ALL
           SELECT (SELECT "Priority" FROM {t} WHERE {pending} AND "Priority" > prios.p
                   ORDER BY "Priority" LIMIT 1)
           FROM prios WHERE prios.p IS NOT NULL),
           no_queue AS (
           SELECT ctid, "Id" FROM {t}
           WHERE {pending} AND "Queue" IS NULL AND {free}
           LIMIT 10
           FOR UPDATE SKIP LOCKED),
           no_run_at AS (
           SELECT u.ctid, u."Id" FROM prios, LATERAL (
             SELECT ctid, "Id" FROM {t}
             WHERE {pending} AND "Priority" = prios.p AND "RunAt" IS NULL AND {free}
             LIMIT 10
             FOR UPDATE SKIP LOCKED) AS u
           LIMIT 10),
           no_priority AS (
           SELECT ctid, "Id" FROM {t}
           WHERE {pending} AND "Priority" IS NULL AND "RunAt" IS NULL AND {free}
           LIMIT 10
           FOR UPDATE SKIP LOCKED)"#
    )
}

/// The `column` (`ctid` or `"Id"`) of the rows [`unusable_sql`] selects, to follow
/// `SELECT {column} FROM due`.
fn unusable_rows(v2: bool, column: &str) -> String {
    if v2 {
        format!(
            r#" UNION ALL SELECT {column} FROM no_queue UNION ALL SELECT {column} FROM no_run_at
               UNION ALL SELECT {column} FROM no_priority"#
        )
    } else {
        format!(r#" UNION ALL SELECT {column} FROM unusable"#)
    }
}

/// `WITH`, or `WITH RECURSIVE` when the statement looks for unusable rows on version 2.
fn with_clause(key: ClaimKey) -> &'static str {
    if key.unusable && key.v2 {
        "WITH RECURSIVE"
    } else {
        "WITH"
    }
}

/// The ordered-key condition of the claim's selection from `t` (version 4): a row with an
/// `OrderKey` is claimable only when no other pending row of its key is older by
/// (`CreatedAt`, `Id`), so a key's rows run one at a time in the order they were
/// scheduled, and a row that runs, waits for a retry or is leased holds the younger ones
/// (it is pending) until it completes or is dead-lettered. A row without a key stops at
/// `IS NULL`; a keyed one is one seek in the partial `IX_<t>_OrderKey`, which stops at the
/// first older row. Any claimer's snapshot sees a running row as pending, and the
/// completion that releases the next row commits before any claim can see it gone.
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

/// The claim's filters of `key` from parameter `$first` on: the types (`text[]`), the
/// queue (`text`) or queues (`text[]`), the cursor position (priority on version 2,
/// `RunAt`, `Id`), in that order ([`PgDriver::bind_filters`] binds them so).
fn claim_filter(key: ClaimKey, first: usize) -> String {
    let mut n = first;
    let mut filter = String::new();
    if key.types {
        filter.push_str(&format!("\n             AND \"Type\" = ANY(${n})"));
        n += 1;
    }
    match key.queues {
        super::QueueFilter::All => {}
        super::QueueFilter::One => {
            filter.push_str(&format!("\n             AND \"Queue\" = ${n}"));
            n += 1;
        }
        super::QueueFilter::Many => {
            filter.push_str(&format!("\n             AND \"Queue\" = ANY(${n})"));
            n += 1;
        }
    }
    if key.after {
        if key.v2 {
            filter.push_str(&format!(
                "\n             AND (\"Priority\", \"RunAt\", \"Id\") > (${n}, ${}, ${})",
                n + 1,
                n + 2
            ));
        } else {
            filter.push_str(&format!(
                "\n             AND (\"RunAt\", \"Id\") > (${n}, ${})",
                n + 1
            ));
        }
    }
    filter
}

/// The claim's update of the selected rows (`$2` token, `$4` lease). `Attempts` counts
/// the claim only when it is a count below `i32::MAX`: NULL, a negative count and the
/// maximum are left as they are, so the executor sees (and names) what was stored
/// instead of a saturated or grown count, and a hostile value cannot fail the statement.
///
/// The rows are found by the tuple ids `due` locked (`ctid = ANY(ARRAY(…))`, a TID
/// scan), not by joining `due`: for a claim of more than ~100 rows the planner hashed a
/// join against a sequential scan of the whole table, so every claim cost O(table) and a
/// batch of 200 drained at half the rate of a batch of 50; nor by primary key, one more
/// index descent per claimed row. `FOR UPDATE` locks the newest version of each row and
/// yields its `ctid`; a version committed after the statement's snapshot (another
/// processor stamped or released the row just then) is not visible to the update and
/// the row is simply not claimed this time. The ids must match too: a `ctid` names a
/// row only within one table, and on a partitioned table the same `ctid` exists in
/// every partition (a filter on the rows the TID scan returns, not a second lookup).
fn lease_sql(t: &str, key: ClaimKey) -> String {
    let (unusable_ctids, unusable_ids) = if key.unusable {
        (
            unusable_rows(key.v2, "ctid"),
            unusable_rows(key.v2, r#""Id""#),
        )
    } else {
        (String::new(), String::new())
    };
    format!(
        r#"UPDATE {t} AS c
           SET "LockToken" = $2, "LockedUntil" = now() + make_interval(secs => $4),
               "Attempts" = CASE WHEN c."Attempts" BETWEEN 0 AND 2147483646
                                 THEN c."Attempts" + 1 ELSE c."Attempts" END
           WHERE c.ctid = ANY(ARRAY(SELECT ctid FROM due{unusable_ctids}))
             AND c."Id" = ANY(ARRAY(SELECT "Id" FROM due{unusable_ids}))
           RETURNING c.*"#
    )
}

/// [`ordered_filter`] when `key` is of a version-4 table.
fn ordered(t: &str, key: ClaimKey) -> String {
    if key.v4 {
        ordered_filter(t)
    } else {
        String::new()
    }
}

/// The claim (or stamp-and-claim) statement of `key` on table `t` (history `h`).
fn claim_sql(t: &str, h: &str, key: ClaimKey) -> String {
    if key.stamp {
        return stamp_claim_sql(t, h, key);
    }
    format!(
        "{} {} {}",
        with_clause(key),
        due_sql(t, key, &(claim_filter(key, 5) + &ordered(t, key))),
        lease_sql(t, key)
    )
}

/// Every outcome kind in one statement: 0 completed, 1 retry, 2 dead, 3 release, 4
/// snooze, from the arrays `$first..$first+4` (id, token, kind, delay, error), each row
/// found by `lookup`. Columns a kind does not change are written back unchanged, which
/// keeps a release a HOT update. A snooze gives the attempt back like a release and, on a
/// version-2 table (`v2`), counts itself in `Snoozes` (saturating); on version 1 it is a
/// release with a move.
fn set_state_sql(t: &str, first: usize, v2: bool, lookup: Lookup) -> String {
    update_sql(t, &stamp_rows(first), None, v2, lookup)
}

/// [`set_state_sql`] as a statement that returns the count of rows stamped.
fn set_state_counted(t: &str, v2: bool, lookup: Lookup) -> String {
    format!(
        "WITH stamped AS ({} RETURNING 1) SELECT count(*) FROM stamped",
        set_state_sql(t, 1, v2, lookup)
    )
}

/// The stamps' rows from the arrays `$first..$first+4` (id, token, kind, delay, error).
fn stamp_rows(first: usize) -> String {
    let [id, token, kind, delay, error] = [0, 1, 2, 3, 4].map(|i| first + i);
    format!(
        "unnest(${id}::uuid[], ${token}::uuid[], ${kind}::int2[], ${delay}::float8[], ${error}::text[])
                AS s(id, token, kind, delay, error)"
    )
}

/// How a stamp finds the rows of its stamp rows `s` (`id`, `token`) in the table `c`.
///
/// The plain join (`c."Id" = s.id AND c."LockToken" = s.token`) leaves the join order to
/// the planner, and a generic plan costed on statistics that count the table as one row
/// (a vacuum that found no live row while a held horizon kept every dead one sets
/// `reltuples` to 0) put the table outside the join and walked its whole primary key,
/// dead entries and all, for every stamp. A lateral subquery cannot be outside: it is
/// evaluated for each stamp row, one probe of the key each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lookup {
    /// Each row's version in the statement's snapshot, found by a lateral probe of the
    /// key (`OFFSET 0` keeps the planner from merging it into the join), then reached by
    /// its physical address. A row another transaction updated after the statement's
    /// snapshot (a lease renewal in flight, an operator, another program) is skipped: its
    /// newer version has another address. The stamp then falls short, as it does for a
    /// stale outcome, and [`Lookup::ByIds`] runs for the whole batch.
    Lateral,
    /// The plain join beside `"Id" = ANY($ids)` (the id array at this parameter), which
    /// searches the key whichever side the table is on and rechecks id and token on a
    /// version updated meanwhile. In a normal plan the array condition joins every probe
    /// of the key, and each probe walks the array again, so it is only the second try.
    ByIds(usize),
}

impl Lookup {
    /// The stamp rows `from` (aliased `s`), those meeting `filter`, as the `FROM` (or
    /// `USING`) item of a statement on `t` aliased `c`, and the condition that pairs each
    /// with its row.
    fn rows(self, t: &str, from: &str, filter: Option<&str>) -> (String, String) {
        match self {
            Lookup::Lateral => {
                let filter = filter.map(|f| format!(" WHERE {f}")).unwrap_or_default();
                (
                    format!(
                        r#"(SELECT s.*, x.tbl, x.row FROM {from}
                             CROSS JOIN LATERAL (
                               SELECT tableoid AS tbl, ctid AS row FROM {t}
                               WHERE "Id" = s.id AND "LockToken" = s.token OFFSET 0) AS x{filter}) AS s"#
                    ),
                    r#"c.tableoid = s.tbl AND c.ctid = s.row AND c."LockToken" = s.token"#
                        .to_owned(),
                )
            }
            Lookup::ByIds(ids) => {
                let filter = filter.map(|f| format!(" AND {f}")).unwrap_or_default();
                (
                    from.to_owned(),
                    format!(
                        r#"c."Id" = ANY(${ids}::uuid[]) AND c."Id" = s.id AND c."LockToken" = s.token{filter}"#
                    ),
                )
            }
        }
    }
}

/// The stamps' update of `t` from the rows `from` (aliased `s`) meeting `filter`.
fn update_sql(t: &str, from: &str, filter: Option<&str>, v2: bool, lookup: Lookup) -> String {
    update_v4_sql(t, from, filter, v2, false, lookup)
}

/// [`update_sql`]; with `v4` a retry or a dead-letter also writes `Errors` from the
/// stamps' `errors` (the array the processor computed; NULL leaves it as it is).
fn update_v4_sql(
    t: &str,
    from: &str,
    filter: Option<&str>,
    v2: bool,
    v4: bool,
    lookup: Lookup,
) -> String {
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
    let (rows, paired) = lookup.rows(t, from, filter);
    format!(
        r#"UPDATE {t} AS c
           SET "ProcessedAt" = CASE WHEN s.kind = 0 THEN now() ELSE c."ProcessedAt" END,
               "DeadLetteredAt" = CASE WHEN s.kind = 2 THEN now() ELSE c."DeadLetteredAt" END,
               "RunAt" = CASE WHEN s.delay IS NOT NULL
                              THEN now() + make_interval(secs => s.delay)
                              ELSE c."RunAt" END,
               "LastError" = CASE WHEN s.kind IN (1, 2) THEN s.error ELSE c."LastError" END,
               "Attempts" = CASE WHEN s.kind IN (3, 4) THEN GREATEST(c."Attempts" - 1, 0)
                                 ELSE c."Attempts" END,
               {errors}{snoozes}"LockToken" = NULL, "LockedUntil" = NULL
           FROM {rows}
           WHERE {paired}"#
    )
}

/// The stamps of a version-3 table as CTEs ending in `stamped` (one row per row
/// stamped), from the arrays `$first..$first+4`, each row found by `lookup`: completed
/// rows are deleted from `t` and inserted into its history `h` with `ProcessedAt = now()`
/// and no lease, in the same statement; every other kind is the in-place update of
/// [`set_state_sql`]. Both are guarded by the lease token, so a stale success stamp moves
/// nothing. A `gate` (`WHERE …`, or empty) on the stamps' rows lets a statement stamp
/// nothing unless its condition holds.
fn stamp_move_ctes(
    t: &str,
    h: &str,
    first: usize,
    version: u32,
    lookup: Lookup,
    gate: &str,
) -> String {
    let columns = crate::engine::column_list(Engine::Postgres, "", version);
    let returning = crate::engine::column_list(Engine::Postgres, "c.", version);
    let values = crate::engine::columns_of(version)
        .map(|c| match c {
            "ProcessedAt" => "now()".to_owned(),
            "LockToken" | "LockedUntil" => "NULL".to_owned(),
            c => format!(r#""{c}""#),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let upsert = crate::engine::history_upsert(Engine::Postgres, version);
    let [id, token, kind, delay, error] = [0, 1, 2, 3, 4].map(|i| first + i);
    // Version 4: a sixth array, each failure's new `Errors`.
    let v4 = version >= 4;
    let (errors, errors_column) = if v4 {
        (format!(", ${}::text[]", first + 5), ", errors")
    } else {
        (String::new(), "")
    };
    let (done_rows, done_paired) = lookup.rows(t, "stamps AS s", Some("s.kind = 0"));
    format!(
        r#"stamps AS (
               SELECT * FROM unnest(${id}::uuid[], ${token}::uuid[], ${kind}::int2[], ${delay}::float8[], ${error}::text[]{errors})
                 AS s(id, token, kind, delay, error{errors_column}){gate}),
           done AS (
               DELETE FROM {t} AS c USING {done_rows}
               WHERE {done_paired}
               RETURNING {returning}),
           moved AS (
               INSERT INTO {h} ({columns}) SELECT {values} FROM done
               ON CONFLICT ("Id") DO UPDATE SET {upsert} RETURNING 1),
           updated AS ({} RETURNING 1),
           stamped AS (SELECT 1 FROM moved UNION ALL SELECT 1 FROM updated)"#,
        update_v4_sql(t, "stamps AS s", Some("s.kind <> 0"), true, v4, lookup)
    )
}

/// The condition that finds the rows of the id array `$ids` through the primary key,
/// whichever side of a join the planner puts the table on, for lease renewals and checks
/// (see [`Lookup`]).
fn by_ids(alias: &str, ids: usize) -> String {
    format!(r#"{alias}"Id" = ANY(${ids}::uuid[])"#)
}

/// A stamp statement in the two forms of [`Lookup`], each returning the count of rows
/// stamped.
struct StampSql {
    /// [`Lookup::Lateral`].
    first: Arc<str>,
    /// [`Lookup::ByIds`], for a batch the first form stamped only part of.
    again: Arc<str>,
}

/// Stamps and claims in one statement: the stamped rows are leased, so the claim's
/// snapshot never selects them. One row comes back even when nothing is claimed, so the
/// stamped count always arrives.
fn stamp_claim_sql(t: &str, h: &str, key: ClaimKey) -> String {
    let stamps = if key.history {
        stamp_move_ctes(t, h, 5, if key.v4 { 4 } else { 3 }, Lookup::Lateral, "")
    } else {
        format!(
            "stamped AS ({} RETURNING 1)",
            set_state_sql(t, 5, key.v2, Lookup::Lateral)
        )
    };
    format!(
        r#"{} {stamps},
                {},
                claimed AS ({})
           SELECT n.stamped AS "icq_stamped", claimed.*
           FROM (SELECT count(*) AS stamped FROM stamped) AS n LEFT JOIN claimed ON true"#,
        with_clause(key),
        due_sql(
            t,
            key,
            &(claim_filter(key, 10 + usize::from(key.v4)) + &ordered(t, key))
        ),
        lease_sql(t, key)
    )
}

/// The pending statuses' condition, for reads by unique key.
const PENDING: &str = r#""ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#;

impl Sql {
    /// The set-state statements of a table of schema `version`.
    fn set_state(&self, version: u32) -> &StampSql {
        &self.set_state[version.clamp(1, 4) as usize - 1]
    }

    fn new(t: &str, h: &str) -> Sql {
        let set_state = |version: u32| {
            let form = |lookup| -> Arc<str> {
                if version >= 3 {
                    format!(
                        "WITH {} SELECT count(*) FROM stamped",
                        stamp_move_ctes(t, h, 1, version, lookup, "")
                    )
                    .into()
                } else {
                    set_state_counted(t, version >= 2, lookup).into()
                }
            };
            StampSql {
                first: form(Lookup::Lateral),
                again: form(Lookup::ByIds(1)),
            }
        };
        // The rows are picked through the retention index and locked, skipping rows
        // another statement holds.
        let sweep_move = |version| {
            let columns = crate::engine::column_list(Engine::Postgres, "", version);
            format!(
                r#"WITH moved AS (
                       DELETE FROM {t} WHERE ctid = ANY(ARRAY(
                           SELECT ctid FROM {t} WHERE "ProcessedAt" IS NOT NULL
                           ORDER BY "ProcessedAt" LIMIT $1
                           FOR UPDATE SKIP LOCKED))
                       RETURNING {columns})
                   INSERT INTO {h} ({columns}) SELECT {columns} FROM moved
                   ON CONFLICT ("Id") DO UPDATE SET {upsert}"#,
                upsert = crate::engine::history_upsert(Engine::Postgres, version)
            )
            .into()
        };
        Sql {
            set_state: [1, 2, 3, 4].map(set_state),
            sweep_move: sweep_move(3),
            sweep_move_v4: sweep_move(4),
            sweep_history: format!(
                r#"DELETE FROM {h} WHERE "Id" IN (
                       SELECT "Id" FROM {h}
                       WHERE "ProcessedAt" < now() - make_interval(secs => $1)
                       ORDER BY "ProcessedAt" LIMIT $2)"#
            )
            .into(),
            insert: insert_sql(t).into(),
            insert_v2: insert_v2_sql(t, false).into(),
            insert_v4: insert_v2_sql(t, true).into(),
            pending_by_key: format!(r#"SELECT "Id" FROM {t} WHERE "UniqueKey" = $1 AND {PENDING}"#)
                .into(),
            extend: format!(
                r#"UPDATE {t} AS c SET "LockedUntil" = now() + make_interval(secs => $3)
                   FROM unnest($1::uuid[], $2::uuid[]) AS s(id, token)
                   WHERE {by_ids} AND c."Id" = s.id AND c."LockToken" = s.token
                   RETURNING c."Id", c."LockToken""#,
                by_ids = by_ids("c.", 1)
            )
            .into(),
            // Whether the row is pending is read, not filtered on: with it in the
            // `WHERE`, the generic plan of a table not yet analyzed walked the poll
            // index's every pending row once per lease (130 ms for 50 leases among
            // 20,000 rows) instead of looking each lease up by primary key.
            check: format!(
                r#"SELECT c."Id", c."LockToken",
                          (c."ProcessedAt" IS NULL AND c."DeadLetteredAt" IS NULL) AS "Pending"
                   FROM {t} AS c JOIN unnest($1::uuid[], $2::uuid[]) AS s(id, token)
                     ON c."Id" = s.id AND c."LockToken" = s.token
                   WHERE {by_ids}"#,
                by_ids = by_ids("c.", 1)
            )
            .into(),
            sweep: format!(
                r#"DELETE FROM {t} WHERE "Id" IN (
                       SELECT "Id" FROM {t}
                       WHERE "ProcessedAt" IS NOT NULL
                         AND "ProcessedAt" < now() - make_interval(secs => $1)
                       ORDER BY "ProcessedAt" LIMIT $2)"#
            )
            .into(),
            activity_v1: activity_sql(t, "", false).into(),
            activity: activity_sql(t, "", true).into(),
            activity_in: activity_sql(
                t,
                r#"
                   AND ("Queue" = ANY($1) OR "Queue" IS NULL)"#,
                true,
            )
            .into(),
            bulk: BulkSql::new(t),
            claims: Default::default(),
            hand_on: std::sync::OnceLock::new(),
        }
    }
}

/// Rows [`QueueOps::activity`] counts at most: the idle check asks only whether any are
/// due or running, and a bounded count in claim order is a short walk of the poll index,
/// where an unbounded one is a sequential scan of the whole table whenever the planner's
/// statistics still remember a backlog (at the end of every drain: 5–30 ms per replica).
pub(crate) const ACTIVITY_COUNT_CAP: u32 = 1_000;

/// In the poll index's order ([`poll_order`]), so the planner walks that index instead
/// of scanning the table.
fn activity_sql(t: &str, filter: &str, v2: bool) -> String {
    let order = poll_order(v2);
    format!(
        r#"SELECT count(*) FILTER (WHERE "LockedUntil" IS NULL OR "LockedUntil" <= now()) AS due,
                  count(*) FILTER (WHERE "LockedUntil" > now()) AS running
           FROM (SELECT "LockedUntil" FROM {t}
                 WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL
                   AND ("RunAt" <= now() OR "RunAt" IS NULL OR "LockedUntil" > now()){filter}
                 ORDER BY {order}
                 LIMIT {ACTIVITY_COUNT_CAP}) AS head"#
    )
}

fn insert_sql(t: &str) -> String {
    format!(
        r#"INSERT INTO {t} ("Id", "Type", "Payload", "RunAt", "UserId", "Roles", "TenantId", "CorrelationId")
           VALUES ($1, $2, $3, COALESCE($4, now() + make_interval(secs => $5)), $6, $7, $8, $9)"#
    )
}

/// The version-2 insert (with `v4`, naming the order and concurrency keys too): a pending row holding the same unique key makes it insert
/// nothing and return no row (the unique index's own predicate names it as the arbiter,
/// so a duplicate `Id` still fails).
fn insert_v2_sql(t: &str, v4: bool) -> String {
    let (columns, values) = if v4 {
        (r#", "OrderKey", "ConcurrencyKey""#, ", $14, $15")
    } else {
        ("", "")
    };
    format!(
        r#"INSERT INTO {t} ("Id", "Type", "Payload", "RunAt", "UserId", "Roles", "TenantId", "CorrelationId",
                            "Queue", "Priority", "UniqueKey", "TraceParent"{columns})
           VALUES ($1, $2, $3, COALESCE($4, now() + make_interval(secs => $5)), $6, $7, $8, $9,
                   $10, $11, $12, $13{values})
           ON CONFLICT ("UniqueKey") WHERE "UniqueKey" IS NOT NULL AND {PENDING} DO NOTHING
           RETURNING "Id""#
    )
}

/// Splits a [`RunAt`] into the (fixed instant, delay seconds) pair the SQL takes.
pub(crate) fn run_at_parts(run_at: RunAt) -> (Option<chrono::DateTime<chrono::Utc>>, f64) {
    match run_at {
        RunAt::Now => (None, 0.0),
        RunAt::At(at) => (Some(at), 0.0),
        RunAt::After(delay) => (None, delay.as_secs_f64()),
    }
}

/// Inserts `command` through `conn` — a pooled connection or, with `&mut *tx`, the
/// caller's open transaction, so the command commits or rolls back with it. With a
/// unique key whose pending row exists (committed, or inserted earlier in the same
/// transaction), inserts nothing and returns that row's id (`existing: true`).
pub async fn insert_command(
    conn: &mut PgConnection,
    table: &TableName,
    command: &NewCommand,
) -> Result<Scheduled> {
    command.validate()?;
    let t = table.quoted(Engine::Postgres);
    let version = if command.uses_v2_columns() {
        table_version(conn, &t, table).await?
    } else {
        1
    };
    let sql = Inserts {
        v1: insert_sql(&t).into(),
        v2: insert_v2_sql(&t, false).into(),
        v4: insert_v2_sql(&t, true).into(),
        by_key: format!(r#"SELECT "Id" FROM {t} WHERE "UniqueKey" = $1 AND {PENDING}"#).into(),
    };
    insert_with(conn, &sql, table, command, version).await
}

/// Copies `commands` (none with a unique key) into the table through `conn` with
/// `statement` (the table's `COPY … FROM STDIN`, naming the version-2 columns with `v2`,
/// and the order and concurrency keys too with `v4`):
/// the bulk path, the fastest PostgreSQL has, and it runs in the caller's transaction.
async fn copy_rows(
    conn: &mut PgConnection,
    statement: &str,
    commands: &[&NewCommand],
    v2: bool,
    v4: bool,
) -> std::result::Result<(), sqlx::Error> {
    if commands.is_empty() {
        return Ok(());
    }
    // The transaction's now(), so RunAt = now agrees with the CreatedAt default.
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&mut *conn)
        .await?;
    let mut copy = conn.copy_in_raw(statement).await?;
    let mut buf = String::with_capacity(256 * 1024);
    for command in commands {
        let run_at = match command.run_at {
            RunAt::Now => now,
            RunAt::At(at) => at,
            RunAt::After(delay) => {
                now + chrono::Duration::from_std(delay).unwrap_or(chrono::TimeDelta::MAX)
            }
        };
        let ctx = &command.context;
        let id = command.id.to_string();
        let payload = command.payload.to_string();
        let run_at = run_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let roles = ctx.roles_json();
        let priority = command.priority.to_string();
        let trace_parent = command.trace_parent_to_store();
        let fields = [
            Some(id.as_str()),
            Some(command.type_name.as_str()),
            Some(payload.as_str()),
            Some(run_at.as_str()),
            ctx.user_id.as_deref(),
            roles.as_deref(),
            ctx.tenant_id.as_deref(),
            ctx.correlation_id.as_deref(),
        ];
        let v2_fields = [
            Some(command.queue.as_str()),
            Some(priority.as_str()),
            trace_parent.as_deref(),
            command.order_key.as_deref(),
            command.concurrency_key.as_deref(),
        ];
        let v2_fields = match (v2, v4) {
            (true, true) => &v2_fields[..],
            (true, false) => &v2_fields[..3],
            (false, _) => &[],
        };
        for (i, field) in fields
            .into_iter()
            .chain(v2_fields.iter().copied())
            .enumerate()
        {
            if i > 0 {
                buf.push(',');
            }
            csv_field(&mut buf, field);
        }
        buf.push('\n');
        if buf.len() > 240 * 1024 {
            copy.send(std::mem::take(&mut buf).into_bytes()).await?;
            buf.reserve(256 * 1024);
        }
    }
    if !buf.is_empty() {
        copy.send(buf.into_bytes()).await?;
    }
    copy.finish().await?;
    Ok(())
}

/// The statements of a bulk insert into one table: the `COPY`s of commands without a
/// unique key, one multi-row insert of those with one, and the read of the pending rows
/// holding the keys that insert did not take.
struct BulkSql {
    copy: String,
    copy_v2: String,
    /// `copy_v2` naming the order and concurrency keys too (schema version 4).
    copy_v4: String,
    keyed: String,
    /// `keyed` with the order and concurrency keys (`$14`, `$15`).
    keyed_v4: String,
    by_keys: String,
}

impl BulkSql {
    fn new(t: &str) -> BulkSql {
        BulkSql {
            copy: format!(
                r#"COPY {t} ("Id", "Type", "Payload", "RunAt", "UserId", "Roles", "TenantId", "CorrelationId")
                   FROM STDIN WITH (FORMAT csv)"#
            ),
            copy_v2: format!(
                r#"COPY {t} ("Id", "Type", "Payload", "RunAt", "UserId", "Roles", "TenantId", "CorrelationId", "Queue", "Priority", "TraceParent")
                   FROM STDIN WITH (FORMAT csv)"#
            ),
            copy_v4: format!(
                r#"COPY {t} ("Id", "Type", "Payload", "RunAt", "UserId", "Roles", "TenantId", "CorrelationId", "Queue", "Priority", "TraceParent", "OrderKey", "ConcurrencyKey")
                   FROM STDIN WITH (FORMAT csv)"#
            ),
            keyed: keyed_sql(t, false),
            keyed_v4: keyed_sql(t, true),
            by_keys: format!(
                r#"SELECT "UniqueKey", "Id" FROM {t} WHERE "UniqueKey" = ANY($1::text[]) AND {PENDING}"#
            ),
        }
    }
}

/// The multi-row insert of commands with a unique key, in batch order, so the first of
/// two commands with one key is the one stored; a pending row holding the key (stored
/// before, or earlier in this statement) makes a row insert nothing, as the single insert
/// does. With `v4` it names the order and concurrency keys too (`$14`, `$15`).
fn keyed_sql(t: &str, v4: bool) -> String {
    let (columns, arrays, names, values) = if v4 {
        (
            r#", "OrderKey", "ConcurrencyKey""#,
            ", $14::text[], $15::text[]",
            ", order_key, concurrency_key",
            ", s.order_key, s.concurrency_key",
        )
    } else {
        ("", "", "", "")
    };
    format!(
        r#"INSERT INTO {t} ("Id", "Type", "Payload", "RunAt", "UserId", "Roles", "TenantId", "CorrelationId",
                           "Queue", "Priority", "UniqueKey", "TraceParent"{columns})
           SELECT s.id, s.type, s.payload::jsonb, COALESCE(s.at, now() + make_interval(secs => s.delay)),
                  s.user_id, s.roles, s.tenant_id, s.correlation_id, s.queue, s.priority, s.key, s.trace_parent{values}
           FROM unnest($1::uuid[], $2::text[], $3::text[], $4::timestamptz[], $5::float8[], $6::text[],
                       $7::text[], $8::text[], $9::text[], $10::text[], $11::int2[], $12::text[], $13::text[]{arrays})
                WITH ORDINALITY
                AS s(id, type, payload, at, delay, user_id, roles, tenant_id, correlation_id, queue,
                     priority, key, trace_parent{names}, n)
           ORDER BY s.n
           ON CONFLICT ("UniqueKey") WHERE "UniqueKey" IS NOT NULL AND {PENDING} DO NOTHING
           RETURNING "Id""#
    )
}

/// Rows of one multi-row insert of commands with a unique key (thirteen arrays; no
/// limit on binds, but a bounded statement keeps one failure's work small).
const KEYED_ROWS_PER_STATEMENT: usize = 5_000;

/// Inserts `commands` (validated, of a table of schema `version`) through `conn`, which
/// is inside a transaction: those without a unique key by `COPY`, those with one by one
/// multi-row insert per chunk that leaves out a key a pending row holds, then one read of
/// those rows' ids. One [`Scheduled`] per command, in order; a command whose key's row
/// settled between the insert and the read goes through the single insert, which tries
/// again.
async fn insert_many(
    conn: &mut PgConnection,
    sql: &BulkSql,
    inserts: &Inserts,
    table: &TableName,
    commands: &[NewCommand],
    version: u32,
) -> Result<Vec<Scheduled>> {
    let context = || format!("scheduling commands in bulk into {table}");
    for command in commands {
        if command.id.as_uuid().is_none() {
            return Err(Error::invalid(format!(
                "`{}` is not a UUID: PostgreSQL stores ids as uuid",
                command.id
            )));
        }
    }
    let v2 = version >= 2 && commands.iter().any(NewCommand::uses_v2_columns);
    // Only a batch that sets a key names the version-4 columns.
    let v4 = v2 && commands.iter().any(|c| c.needs_v4().is_some());
    let keyed = |c: &NewCommand| v2 && c.unique_key.is_some();
    let copied: Vec<&NewCommand> = commands.iter().filter(|c| !keyed(c)).collect();
    let statement = match (v2, v4) {
        (true, true) => &sql.copy_v4,
        (true, false) => &sql.copy_v2,
        (false, _) => &sql.copy,
    };
    copy_rows(conn, statement, &copied, v2, v4)
        .await
        .map_err(Error::db(context()))?;
    let mut scheduled: Vec<Scheduled> = commands
        .iter()
        .map(|c| Scheduled::new(c.id.clone()))
        .collect();
    let with_key: Vec<usize> = (0..commands.len())
        .filter(|&i| keyed(&commands[i]))
        .collect();
    for chunk in with_key.chunks(KEYED_ROWS_PER_STATEMENT) {
        let rows: Vec<&NewCommand> = chunk.iter().map(|&i| &commands[i]).collect();
        let statement = if v4 { &sql.keyed_v4 } else { &sql.keyed };
        let inserted: Vec<Uuid> = keyed_query(statement, &rows, v4)
            .fetch_all(&mut *conn)
            .await
            .map_err(Error::db(context()))?;
        let inserted: std::collections::HashSet<Uuid> = inserted.into_iter().collect();
        let left: Vec<usize> = chunk
            .iter()
            .copied()
            .filter(|&i| {
                commands[i]
                    .id
                    .as_uuid()
                    .is_none_or(|id| !inserted.contains(&id))
            })
            .collect();
        if left.is_empty() {
            continue;
        }
        let keys: Vec<&str> = left
            .iter()
            .filter_map(|&i| commands[i].unique_key.as_deref())
            .collect();
        let holders: Vec<(String, Uuid)> = sqlx::query_as(AssertSqlSafe(sql.by_keys.clone()))
            .bind(&keys)
            .fetch_all(&mut *conn)
            .await
            .map_err(Error::db(context()))?;
        let holders: std::collections::HashMap<String, Uuid> = holders.into_iter().collect();
        for i in left {
            let holder = commands[i]
                .unique_key
                .as_ref()
                .and_then(|key| holders.get(key));
            scheduled[i] = match holder {
                Some(id) => Scheduled {
                    id: CommandId::from(*id),
                    existing: true,
                },
                None => insert_with(conn, inserts, table, &commands[i], version).await?,
            };
        }
    }
    Ok(scheduled)
}

/// [`BulkSql::keyed`] with the thirteen arrays of `rows` bound (fifteen with `v4`).
fn keyed_query<'q>(
    sql: &str,
    rows: &[&NewCommand],
    v4: bool,
) -> sqlx::query::QueryScalar<'q, sqlx::Postgres, Uuid, sqlx::postgres::PgArguments> {
    let n = rows.len();
    let mut ids = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    let mut payloads = Vec::with_capacity(n);
    let mut ats = Vec::with_capacity(n);
    let mut delays = Vec::with_capacity(n);
    let mut users = Vec::with_capacity(n);
    let mut roles = Vec::with_capacity(n);
    let mut tenants = Vec::with_capacity(n);
    let mut correlations = Vec::with_capacity(n);
    let mut queues = Vec::with_capacity(n);
    let mut priorities = Vec::with_capacity(n);
    let mut keys = Vec::with_capacity(n);
    let mut parents = Vec::with_capacity(n);
    let mut order_keys = Vec::with_capacity(n);
    let mut concurrency_keys = Vec::with_capacity(n);
    for command in rows {
        let (at, delay) = run_at_parts(command.run_at);
        let ctx = &command.context;
        ids.push(command.id.as_uuid().unwrap_or_default());
        types.push(command.type_name.clone());
        payloads.push(command.payload.to_string());
        ats.push(at);
        delays.push(delay);
        users.push(ctx.user_id.clone());
        roles.push(ctx.roles_json());
        tenants.push(ctx.tenant_id.clone());
        correlations.push(ctx.correlation_id.clone());
        queues.push(command.queue.clone());
        priorities.push(command.priority);
        keys.push(command.unique_key.clone());
        parents.push(command.trace_parent_to_store());
        order_keys.push(command.order_key.clone());
        concurrency_keys.push(command.concurrency_key.clone());
    }
    let query = sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
        .bind(ids)
        .bind(types)
        .bind(payloads)
        .bind(ats)
        .bind(delays)
        .bind(users)
        .bind(roles)
        .bind(tenants)
        .bind(correlations)
        .bind(queues)
        .bind(priorities)
        .bind(keys)
        .bind(parents);
    if v4 {
        query.bind(order_keys).bind(concurrency_keys)
    } else {
        query
    }
}

/// Inserts `commands` through `conn` — a pooled connection or, with `&mut *tx`, the
/// caller's open transaction — in bulk ([`insert_many`]), inside a savepoint of its own,
/// so a failure leaves none of them and the caller's transaction usable.
pub async fn insert_commands(
    conn: &mut PgConnection,
    table: &TableName,
    commands: &[NewCommand],
) -> Result<Vec<Scheduled>> {
    super::validate_batch(commands)?;
    if commands.is_empty() {
        return Ok(Vec::new());
    }
    let t = table.quoted(Engine::Postgres);
    let version = super::batch_version(commands, table_version(conn, &t, table)).await?;
    super::refuse_newer_asks(table, version, commands.iter())?;
    let inserts = Inserts {
        v1: insert_sql(&t).into(),
        v2: insert_v2_sql(&t, false).into(),
        v4: insert_v2_sql(&t, true).into(),
        by_key: format!(r#"SELECT "Id" FROM {t} WHERE "UniqueKey" = $1 AND {PENDING}"#).into(),
    };
    let context = || format!("scheduling commands in bulk into {table}");
    let mut savepoint = sqlx::Connection::begin(&mut *conn)
        .await
        .map_err(Error::db(context()))?;
    let scheduled = insert_many(
        &mut savepoint,
        &BulkSql::new(&t),
        &inserts,
        table,
        commands,
        version,
    )
    .await?;
    savepoint.commit().await.map_err(Error::db(context()))?;
    Ok(scheduled)
}

/// The schema version of `t` as `conn` sees it (the caller's transaction has no driver
/// to remember it).
async fn table_version(conn: &mut PgConnection, t: &str, table: &TableName) -> Result<u32> {
    let (has_queue, has_order_key): (bool, bool) = sqlx::query_as(
        r#"SELECT EXISTS (SELECT 1 FROM pg_attribute
                          WHERE attrelid = to_regclass($1) AND attname = 'Queue' AND NOT attisdropped),
                  EXISTS (SELECT 1 FROM pg_attribute
                          WHERE attrelid = to_regclass($1) AND attname = 'OrderKey' AND NOT attisdropped)"#,
    )
    .bind(t)
    .fetch_one(&mut *conn)
    .await
    .map_err(Error::db(format!("looking up the schema version of {table}")))?;
    // Version 3 (the history table) changes nothing an insert writes: it reads as 2.
    Ok(match (has_queue, has_order_key) {
        (true, true) => 4,
        (true, false) => 2,
        (false, _) => 1,
    })
}

/// The insert statements [`insert_with`] chooses from.
struct Inserts {
    v1: Arc<str>,
    v2: Arc<str>,
    /// `v2` with the order and concurrency keys, for a command that sets one.
    v4: Arc<str>,
    by_key: Arc<str>,
}

async fn insert_with(
    conn: &mut PgConnection,
    sql: &Inserts,
    table: &TableName,
    command: &NewCommand,
    version: u32,
) -> Result<Scheduled> {
    command.validate()?;
    let id = command.id.as_uuid().ok_or_else(|| {
        Error::invalid(format!(
            "`{}` is not a UUID: PostgreSQL stores ids as uuid",
            command.id
        ))
    })?;
    super::refuse_newer_asks(table, version, std::iter::once(command))?;
    let (at, delay) = run_at_parts(command.run_at);
    let ctx = &command.context;
    let v2 = version >= 2 && command.uses_v2_columns();
    let context = || format!("scheduling a command into {table}");
    let query = |sql: &Arc<str>| {
        sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(id)
            .bind(&command.type_name)
            .bind(sqlx::types::Json(&command.payload))
            .bind(at)
            .bind(delay)
            .bind(&ctx.user_id)
            .bind(ctx.roles_json())
            .bind(&ctx.tenant_id)
            .bind(&ctx.correlation_id)
    };
    if !v2 {
        query(&sql.v1)
            .execute(&mut *conn)
            .await
            .map_err(Error::db(context()))?;
        return Ok(Scheduled::new(command.id.clone()));
    }
    let v4 = command.needs_v4().is_some();
    let query_v2 = || {
        let query = query(if v4 { &sql.v4 } else { &sql.v2 })
            .bind(&command.queue)
            .bind(command.priority)
            .bind(&command.unique_key)
            .bind(command.trace_parent_to_store());
        if v4 {
            query
                .bind(&command.order_key)
                .bind(&command.concurrency_key)
        } else {
            query
        }
    };
    let Some(key) = &command.unique_key else {
        query_v2()
            .execute(&mut *conn)
            .await
            .map_err(Error::db(context()))?;
        return Ok(Scheduled::new(command.id.clone()));
    };
    for _ in 0..super::UNIQUE_KEY_TRIES {
        let inserted = query_v2()
            .fetch_optional(&mut *conn)
            .await
            .map_err(Error::db(context()))?;
        if inserted.is_some() {
            return Ok(Scheduled::new(command.id.clone()));
        }
        // A pending row holds the key: its id, unless it settled meanwhile.
        let existing: Option<Uuid> = sqlx::query_scalar(AssertSqlSafe(sql.by_key.clone()))
            .bind(key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(Error::db(context()))?;
        if let Some(existing) = existing {
            return Ok(Scheduled {
                id: CommandId::from(existing),
                existing: true,
            });
        }
    }
    Err(super::unique_key_unsettled(table, key))
}

/// The payload's size in bytes as the row holds it (jsonb's binary form), for the
/// producer's buffered-bytes budget.
pub(crate) fn payload_bytes(row: &PgRow) -> usize {
    row.try_get_raw("Payload")
        .ok()
        .and_then(|value| value.as_bytes().ok().map(<[u8]>::len))
        .unwrap_or(0)
}

/// Decodes a full row (`SELECT *` or `RETURNING *`) column by column: a column that
/// cannot be decoded (an infinite timestamp, a payload nested deeper than the JSON
/// decoder goes) becomes a defect of the row rather than an error of the statement.
pub(crate) fn decode_row(row: &PgRow) -> std::result::Result<CommandRow, sqlx::Error> {
    let id: Uuid = row.try_get("Id")?;
    let mut d = Decoder::default();
    let mut out = CommandRow::placeholder(CommandId::from(id));
    let payload = d.get::<_, sqlx::types::Json<serde_json::Value>>(row, "Payload");
    out.payload = payload.map(|p| p.0).unwrap_or_default();
    text_columns(&mut d, row, &mut out);
    out.created_at = required_time(&mut d, row, "CreatedAt");
    out.run_at = required_time(&mut d, row, "RunAt");
    out.attempts = super::decode::attempts(&mut d, row);
    out.lock_token = d
        .get::<_, Option<Uuid>>(row, "LockToken")
        .flatten()
        .map(LeaseToken);
    out.locked_until = optional_time(&mut d, row, "LockedUntil");
    out.processed_at = optional_time(&mut d, row, "ProcessedAt");
    out.dead_lettered_at = optional_time(&mut d, row, "DeadLetteredAt");
    super::decode::v2_columns(&mut d, row, &mut out);
    Ok(d.finish(out))
}

/// Microseconds since PostgreSQL's epoch, 2000-01-01 00:00 UTC.
const PG_EPOCH_UNIX_SECONDS: i64 = 946_684_800;

/// Decodes a `timestamptz` without sqlx's chrono decoder, which panics on `infinity`.
fn time(row: &PgRow, column: &str) -> std::result::Result<Option<DateTime<Utc>>, String> {
    let raw = row.try_get_raw(column).map_err(|e| e.to_string())?;
    if raw.is_null() {
        return Ok(None);
    }
    match raw.format() {
        PgValueFormat::Binary => {
            let micros =
                <i64 as sqlx::Decode<sqlx::Postgres>>::decode(raw).map_err(|e| e.to_string())?;
            match micros {
                i64::MAX => Err("`infinity` is not an instant icq can use".into()),
                i64::MIN => Err("`-infinity` is not an instant icq can use".into()),
                micros => DateTime::from_timestamp(PG_EPOCH_UNIX_SECONDS, 0)
                    .and_then(|epoch| {
                        epoch.checked_add_signed(chrono::TimeDelta::microseconds(micros))
                    })
                    .map(Some)
                    .ok_or_else(|| "the instant is out of the supported range".into()),
            }
        }
        PgValueFormat::Text => {
            let text = raw.as_str().map_err(|e| e.to_string())?;
            crate::command::parse_timestamp(text)
                .map(Some)
                .ok_or_else(|| format!("`{text}` is not an instant icq can use"))
        }
    }
}

/// Where a time icq cannot represent sorts, as a placeholder on the same side of "now"
/// as the stored value, so the row's state (and the listing's) agrees with what the
/// SQL (claims, counts) decides: `infinity` and years past chrono's range sort after
/// every instant, `-infinity` and years before it before.
fn unrepresentable(row: &PgRow, column: &str) -> DateTime<Utc> {
    let later = row
        .try_get_raw(column)
        .ok()
        .filter(|raw| raw.format() == PgValueFormat::Binary)
        .and_then(|raw| <i64 as sqlx::Decode<sqlx::Postgres>>::decode(raw).ok())
        .is_some_and(|micros| micros > 0);
    if later {
        DateTime::<Utc>::MAX_UTC
    } else {
        DateTime::<Utc>::MIN_UTC
    }
}

fn optional_time(d: &mut Decoder, row: &PgRow, column: &str) -> Option<DateTime<Utc>> {
    match d.take(column, time(row, column)) {
        Some(at) => at,
        // Set, but not representable: still set (a completed row stays completed).
        None => Some(unrepresentable(row, column)),
    }
}

fn required_time(d: &mut Decoder, row: &PgRow, column: &str) -> DateTime<Utc> {
    match d.take(column, time(row, column)) {
        Some(Some(at)) => at,
        Some(None) => {
            d.defect(column, "NULL");
            DateTime::<Utc>::UNIX_EPOCH
        }
        None => unrepresentable(row, column),
    }
}

/// Ids and tokens as the `uuid[]` arrays the stamps take. Every id on PostgreSQL is a
/// UUID (the column's type), so none is dropped in practice.
fn lease_arrays<'a>(leases: impl Iterator<Item = &'a Lease>) -> (Vec<Uuid>, Vec<Uuid>) {
    leases
        .filter_map(|l| Some((l.id.as_uuid()?, l.token.0)))
        .unzip()
}

/// Escapes one CSV field for `COPY … (FORMAT csv)`; `None` is the unquoted empty NULL.
fn csv_field(out: &mut String, value: Option<&str>) {
    if let Some(value) = value {
        out.push('"');
        for c in value.chars() {
            if c == '"' {
                out.push('"');
            }
            out.push(c);
        }
        out.push('"');
    }
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Binds a claim's `$1..$4`: limit, token, processing delay, lease.
fn bind_claim<'q>(query: PgQuery<'q>, params: &ClaimParams) -> PgQuery<'q> {
    query
        .bind(i64::from(params.limit))
        .bind(params.token.0)
        .bind(params.processing_delay.as_secs_f64())
        .bind(params.lease.as_secs_f64())
}

/// `text` with every non-ASCII character written as Rust writes an escape (`\u{20ac}`):
/// what any server encoding can store.
fn ascii_escaped(text: &str) -> String {
    if text.is_ascii() {
        return text.to_owned();
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if c.is_ascii() {
            escaped.push(c);
        } else {
            escaped.extend(c.escape_unicode());
        }
    }
    escaped
}

/// The five arrays of a set-state statement (six on a version-4 table: `histories`).
struct StampArrays {
    ids: Vec<Uuid>,
    tokens: Vec<Uuid>,
    kinds: Vec<i16>,
    delays: Vec<Option<f64>>,
    errors: Vec<Option<String>>,
    /// Each failure's new `Errors` array; `None` on a table older than version 4.
    histories: Option<Vec<Option<String>>>,
}

impl StampArrays {
    /// The arrays of `changes`; with `ascii`, error texts escape every non-ASCII
    /// character (`\u{20ac}`), for a database whose encoding cannot hold them all. With
    /// `v4`, the sixth array of `Errors` too (escaped as JSON, `\u20ac`, with `ascii`).
    fn new(changes: &[SetState], ascii: bool, v4: bool) -> StampArrays {
        let n = changes.len();
        let mut arrays = StampArrays {
            ids: Vec::with_capacity(n),
            tokens: Vec::with_capacity(n),
            kinds: Vec::with_capacity(n),
            delays: Vec::with_capacity(n),
            errors: Vec::with_capacity(n),
            histories: v4.then(|| Vec::with_capacity(n)),
        };
        for change in changes {
            let Some(id) = change.lease.id.as_uuid() else {
                continue;
            };
            arrays.ids.push(id);
            arrays.tokens.push(change.lease.token.0);
            arrays.kinds.push(change.kind());
            arrays.delays.push(change.delay_seconds());
            let error = change.error();
            arrays.errors.push(if ascii {
                error.map(|text| ascii_escaped(&text))
            } else {
                error
            });
            if let Some(histories) = &mut arrays.histories {
                let history = change.errors();
                histories.push(if ascii {
                    history.map(json_ascii_escaped)
                } else {
                    history.map(str::to_owned)
                });
            }
        }
        arrays
    }

    fn bind(self, query: PgQuery<'_>) -> PgQuery<'_> {
        let query = query
            .bind(self.ids)
            .bind(self.tokens)
            .bind(self.kinds)
            .bind(self.delays)
            .bind(self.errors);
        match self.histories {
            Some(histories) => query.bind(histories),
            None => query,
        }
    }
    /// [`StampArrays::bind`] for a statement that returns one value (the count).
    fn bind_scalar<'q, O>(
        self,
        query: sqlx::query::QueryScalar<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::QueryScalar<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
        let query = query
            .bind(self.ids)
            .bind(self.tokens)
            .bind(self.kinds)
            .bind(self.delays)
            .bind(self.errors);
        match self.histories {
            Some(histories) => query.bind(histories),
            None => query,
        }
    }
}

/// JSON text with every non-ASCII character escaped as JSON does (`\u20ac`, a surrogate
/// pair beyond the first plane): the same JSON value, storable in any encoding. icq's
/// JSON holds non-ASCII characters only inside strings, where the escape is valid.
fn json_ascii_escaped(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let mut units = [0u16; 2];
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

impl PgDriver {
    /// Whether error texts must be escaped to ASCII (see `ascii_errors`).
    fn ascii_errors(&self) -> bool {
        self.ascii_errors.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Decodes claimed rows; one without a readable id is logged and left to its lease.
    fn claimed(&self, rows: &[PgRow], params: &ClaimParams) -> Vec<ClaimedRow> {
        let claimed = super::leased_rows(
            &self.table,
            params.token,
            rows.iter().map(|row| (decode_row(row), payload_bytes(row))),
        );
        if params.types.is_none() && params.queues.is_none() {
            self.cursor.advance(&claimed, params.limit, params.spread);
        }
        claimed
    }

    /// Runs the set-state statement `sql` of a table of schema `version` with the arrays
    /// of `changes`; the count of rows it stamped.
    async fn stamp_with(&self, sql: &Arc<str>, changes: &[SetState], version: u32) -> Result<u64> {
        let query = sqlx::query_scalar(AssertSqlSafe(sql.clone()));
        let query = StampArrays::new(changes, self.ascii_errors(), version >= 4).bind_scalar(query);
        let stamped: i64 = on_work!(self, |e| query.fetch_one(e))
            .await
            .map_err(self.db("stamping outcomes"))?;
        Ok(stamped.max(0) as u64)
    }

    /// After a stamp of `changes` that landed on `stamped` rows: when that is fewer than
    /// it carried (a row updated after the first form's snapshot, a stale outcome, an id
    /// twice), the [`Lookup::ByIds`] form once more for the whole batch (a row already
    /// stamped no longer holds its token), so the updated row is stamped too. The total
    /// stamped.
    async fn stamp_rest(&self, changes: &[SetState], version: u32, stamped: u64) -> Result<u64> {
        if stamped >= stampable(changes) {
            return Ok(stamped);
        }
        let again = &self.sql.set_state(version).again;
        Ok(stamped + self.stamp_with(again, changes, version).await?)
    }

    /// The claim statement for `params` (after the stamps, with `stamp`), its shape and
    /// where it starts: after the cursor for a claim of every queue and type (see
    /// [`cursor`]), at the head otherwise.
    async fn claim_plan(
        &self,
        params: &ClaimParams,
        stamp: bool,
    ) -> Result<(Arc<str>, ClaimKey, Option<cursor::Position>)> {
        let version = self.schema_version().await?;
        super::check_queues(version, &self.table, params.queues.as_deref())?;
        let v2 = version >= 2;
        let queues = super::QueueFilter::of(params.queues.as_deref());
        let after = if params.types.is_none() && queues == super::QueueFilter::All {
            self.cursor.start()
        } else {
            None
        };
        let key = ClaimKey {
            v2,
            history: version >= 3,
            v4: version >= 4,
            stamp,
            types: params.types.is_some(),
            queues,
            after: after.is_some(),
            unusable: !v2 || self.unusable.due(),
            paused: params.skip_paused && version >= 4,
        };
        let sql = self
            .sql
            .claims
            .get(key, |key| claim_sql(&self.t, &self.h, key));
        Ok((sql, key, after))
    }

    /// Binds the filters of a claim of shape `key`, in [`claim_filter`]'s order.
    fn bind_filters<'q>(
        mut query: PgQuery<'q>,
        params: &ClaimParams,
        key: ClaimKey,
        after: Option<cursor::Position>,
    ) -> PgQuery<'q> {
        if let Some(types) = &params.types {
            query = query.bind(types.to_vec());
        }
        match (key.queues, params.queues.as_deref()) {
            (super::QueueFilter::One, Some([queue])) => query = query.bind(queue.clone()),
            (super::QueueFilter::Many, Some(queues)) => query = query.bind(queues.to_vec()),
            _ => {}
        }
        if let Some((priority, run_at, id)) = after {
            if key.v2 {
                query = query.bind(priority);
            }
            query = query.bind(run_at).bind(id);
        }
        query
    }

    /// Connects a pool to `url` for `table`: to the writable server of a URL listing
    /// several hosts, set up for the pooler `options` names (see [`connect`]).
    pub async fn connect(url: &str, table: &TableName, options: &ConnectOptions) -> Result<Self> {
        let servers = connect::parse(url, options.pooler)?;
        let failover = connect::Failover::start(url, servers).await?;
        let pooler = options.pooler;
        let (max, acquire) = (options.max_connections, options.acquire_timeout);
        let pool = failover
            .pool_options(max, acquire, false, pooler)
            .connect_with(failover.current_options())
            .await
            .map_err(Error::db(format!("connecting to {}", redact_url(url))));
        let pool = match pool {
            Ok(pool) => pool,
            Err(err) => {
                failover.stop();
                return Err(err);
            }
        };
        failover.adopt(&pool);
        let work = failover
            .pool_options(max, acquire, true, pooler)
            .connect_lazy_with(failover.current_options());
        failover.adopt(&work);
        let (t, h) = (
            table.quoted(Engine::Postgres),
            table.history().quoted(Engine::Postgres),
        );
        let driver = PgDriver {
            pool,
            work,
            table: table.clone(),
            sql: Sql::new(&t, &h),
            t,
            h,
            failover,
            pooler,
            cursor: cursor::ClaimCursor::default(),
            unusable: Default::default(),
            version: Default::default(),
            listener: std::sync::Mutex::new(None),
            shared_pool: false,
            ascii_errors: Default::default(),
        };
        if let Err(err) = driver.check_connection(url, table).await {
            driver.close().await;
            return Err(err);
        }
        Ok(driver)
    }

    /// A driver on the application's own pool, for `table`: schedules, reads and the
    /// processor's claims and stamps all go through `pool`, each in a transaction of its
    /// own with [`WORK_BEGIN`]'s settings (as on icq's own pools; the
    /// application's statements are untouched), and the LISTEN
    /// connection is opened from `pool`'s connect options. One server, no failover watcher.
    /// A transaction pooler in front of the server is detected (one extra connection, once)
    /// and then handled as `pooler: transaction` is: no LISTEN, each statement in its own
    /// transaction. Closing the driver leaves `pool` open.
    pub(crate) async fn from_pool(pool: PgPool, table: &TableName) -> Result<Self> {
        let options = (*pool.connect_options()).clone();
        let shown = "the application's PostgreSQL pool";
        let pooling = connect::transaction_pooling(&pool, None, &options)
            .await
            .map_err(Error::db(format!("connecting through {shown}")))?;
        let servers = connect::Servers {
            hosts: vec![connect::Host {
                label: String::new(),
                options,
            }],
            attrs: connect::SessionAttrs::Any,
        };
        let failover = connect::Failover::start(shown, servers).await?;
        let (t, h) = (
            table.quoted(Engine::Postgres),
            table.history().quoted(Engine::Postgres),
        );
        let driver = PgDriver {
            work: pool.clone(),
            pool,
            table: table.clone(),
            sql: Sql::new(&t, &h),
            t,
            h,
            failover,
            pooler: if pooling {
                Pooler::Transaction
            } else {
                Pooler::Session
            },
            cursor: cursor::ClaimCursor::default(),
            unusable: Default::default(),
            version: Default::default(),
            listener: std::sync::Mutex::new(None),
            shared_pool: true,
            ascii_errors: Default::default(),
        };
        // The pooler is known: only the schema is left to check.
        if let Err(err) = driver.check_connection(shown, table).await {
            driver.close().await;
            return Err(err);
        }
        Ok(driver)
    }

    /// What `connect` checks once connected: no transaction pooler unless the setting
    /// says so, and the table's schema exists.
    async fn check_connection(&self, url: &str, table: &TableName) -> Result<()> {
        if self.pooler == Pooler::Session && !self.shared_pool {
            let pooling = connect::transaction_pooling(
                &self.pool,
                Some(&self.work),
                &self.failover.current_options(),
            )
            .await
            .map_err(Error::db(format!("connecting to {}", redact_url(url))))?;
            if pooling {
                return Err(Error::Unsupported(format!(
                    "{}: the server hands consecutive statements of one connection to \
                     different server connections (a pooler in transaction mode, such as \
                     PgBouncer's `pool_mode = transaction`), where LISTEN and prepared \
                     statements cannot work: set `pooler: transaction` in this source's \
                     `settings:` (icq then polls and uses no server-side prepared \
                     statements), or use the pooler's session mode",
                    redact_url(url)
                )));
            }
        }
        let query = sqlx::query_scalar::<_, String>("SELECT current_setting('server_encoding')");
        let encoding = on_pool!(self, self.pool, BEGIN, |e| query.fetch_one(e))
            .await
            .map_err(Error::db(format!(
                "looking up the encoding of {table}'s database"
            )))?;
        self.ascii_errors.store(
            !encoding.eq_ignore_ascii_case("UTF8"),
            std::sync::atomic::Ordering::Relaxed,
        );
        if let Some(schema) = table.schema() {
            // A table in a schema that does not exist is a different mistake from a
            // missing table (to_regclass says NULL for both): say which.
            let query = sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            )
            .bind(schema);
            let exists = on_pool!(self, self.pool, BEGIN, |e| query.fetch_one(e))
                .await
                .map_err(Error::db(format!("looking up the schema of {table}")))?;
            if !exists {
                return Err(Error::schema_missing(table, Engine::Postgres));
            }
        }
        Ok(())
    }

    /// Maps a statement's error, telling the failover watcher about it first (an error
    /// that looks like a lost server makes it look for the writable one).
    fn db(&self, what: &str) -> impl FnOnce(sqlx::Error) -> Error + '_ {
        let wrap = Error::db(self.ctx(what));
        move |err| {
            self.failover.saw(&err);
            wrap(err)
        }
    }

    fn ctx(&self, what: &str) -> String {
        format!("{what} ({})", self.table)
    }

    /// Whether the processor's statements need a transaction of their own for
    /// [`WORK_SESSION`]'s settings ([`on_work!`]): the session of a work connection
    /// carries them only on icq's own pools outside transaction pooling.
    fn work_in_transaction(&self) -> bool {
        self.shared_pool || self.pooler == Pooler::Transaction
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

    /// The schema version a schedule of `commands` needs to know: the table's when any
    /// of them names a version-2 column, else 1 (the version-1 insert suits both).
    async fn insert_version<'a>(
        &self,
        mut commands: impl Iterator<Item = &'a NewCommand>,
    ) -> Result<u32> {
        if commands.any(NewCommand::uses_v2_columns) {
            self.schema_version().await
        } else {
            Ok(1)
        }
    }
}

#[async_trait]
impl QueueOps for PgDriver {
    async fn command_insert(&self, params: &CommandInsertParams<'_>) -> Result<Scheduled> {
        let command = params.command;
        let version = self.insert_version(std::iter::once(command)).await?;
        let sql = self.inserts();
        if self.pooler == Pooler::Transaction {
            let mut tx = self
                .pool
                .begin()
                .await
                .map_err(self.db("scheduling a command"))?;
            let scheduled = insert_with(&mut tx, &sql, &self.table, command, version).await?;
            tx.commit()
                .await
                .map_err(self.db("committing a scheduled command"))?;
            return Ok(scheduled);
        }
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(self.db("scheduling a command"))?;
        insert_with(&mut conn, &sql, &self.table, command, version).await
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
        let version = self.insert_version(commands.iter()).await?;
        super::refuse_newer_asks(&self.table, version, commands.iter())?;
        let ctx = "scheduling commands in bulk";
        let mut tx = self.pool.begin().await.map_err(self.db(ctx))?;
        let scheduled = insert_many(
            &mut tx,
            &self.sql.bulk,
            &self.inserts(),
            &self.table,
            commands,
            version,
        )
        .await?;
        tx.commit().await.map_err(self.db(ctx))?;
        Ok(scheduled)
    }

    async fn command_claim(&self, params: &ClaimParams) -> Result<Vec<ClaimedRow>> {
        // A claim after the cursor that finds nothing there (the backlog ends before it, or
        // a spreading jump overshot) is followed at once by one from the head, which the
        // empty claim moved the cursor back to (unless the head is costly: the cursor
        // stays): an empty answer means the queue has nothing due, and makes the
        // processor wait for a wake-up or the polling interval.
        loop {
            let (sql, key, after) = self.claim_plan(params, false).await?;
            let query = bind_claim(sqlx::query(AssertSqlSafe(sql)), params);
            let query = PgDriver::bind_filters(query, params, key, after);
            let started = std::time::Instant::now();
            let rows = on_work!(self, |e| query.fetch_all(e))
                .await
                .map_err(self.db("claiming due commands"))?;
            if key.unusable {
                self.unusable.took(started.elapsed());
            }
            let claimed = self.claimed(&rows, params);
            if !claimed.is_empty() || after.is_none() || !self.cursor.at_head() {
                return Ok(claimed);
            }
        }
    }

    async fn command_set_state_and_claim(
        &self,
        params: &CommandSetStateAndClaimParams<'_>,
    ) -> Result<(u64, Vec<ClaimedRow>)> {
        let (changes, params) = (params.changes, params.claim);
        let (sql, key, after) = self.claim_plan(params, true).await?;
        let query = bind_claim(sqlx::query(AssertSqlSafe(sql)), params);
        let query = StampArrays::new(changes, self.ascii_errors(), key.v4).bind(query);
        let query = PgDriver::bind_filters(query, params, key, after);
        let started = std::time::Instant::now();
        let rows = on_work!(self, |e| query.fetch_all(e))
            .await
            .map_err(self.db("stamping outcomes and claiming due commands"))?;
        if key.unusable {
            self.unusable.took(started.elapsed());
        }
        let stamped = rows
            .first()
            .and_then(|row| row.try_get::<i64, _>("icq_stamped").ok())
            .unwrap_or(0);
        // Should the second form fail, so does the call, though its claim committed: the
        // rows claimed then wait out their lease (none runs twice), where answering with
        // them would drop the outcomes still unstamped and run those commands again.
        let stamped = self
            .stamp_rest(changes, key.version(), stamped.max(0) as u64)
            .await?;
        // With nothing claimed the one row has NULL columns.
        let claimed: Vec<PgRow> = rows
            .into_iter()
            .filter(|row| matches!(row.try_get::<Option<Uuid>, _>("Id"), Ok(Some(_))))
            .collect();
        let claimed = self.claimed(&claimed, params);
        if claimed.is_empty() && after.is_some() && self.cursor.at_head() {
            // Nothing after the cursor: from the head at once (see `command_claim`).
            return Ok((stamped, self.command_claim(params).await?));
        }
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
        let Some(uuid) = id.as_uuid() else {
            return Ok(None);
        };
        let sql = format!(
            r#"SELECT * FROM {} WHERE "Id" = $1"#,
            self.all_rows().await?
        );
        let query = sqlx::query(AssertSqlSafe(sql)).bind(uuid);
        let row = on_pool!(self, self.pool, BEGIN, |e| query.fetch_optional(e))
            .await
            .map_err(self.db("reading a command"))?;
        row.as_ref()
            .map(|r| decode_row(r).map_err(Error::db(self.ctx("decoding a command"))))
            .transpose()
    }

    async fn command_set_state_many(&self, params: &CommandSetStateManyParams<'_>) -> Result<u64> {
        let changes = params.changes;
        let version = self.schema_version().await?;
        let stamped = self
            .stamp_with(&self.sql.set_state(version).first, changes, version)
            .await?;
        self.stamp_rest(changes, version, stamped).await
    }

    async fn lease_extend_many(&self, params: &LeaseExtendManyParams) -> Result<Vec<Lease>> {
        let (leases, lease) = (params.leases.as_slice(), params.lease);
        let (ids, tokens) = lease_arrays(leases.iter());
        let query = sqlx::query(AssertSqlSafe(self.sql.extend.clone()))
            .bind(ids)
            .bind(tokens)
            .bind(lease.as_secs_f64());
        let rows = on_work!(self, |e| query.fetch_all(e))
            .await
            .map_err(self.db("extending leases"))?;
        rows.iter()
            .map(|row| {
                Ok(Lease {
                    id: CommandId::from(row.try_get::<Uuid, _>("Id")?),
                    token: LeaseToken(row.try_get("LockToken")?),
                })
            })
            .collect::<std::result::Result<_, sqlx::Error>>()
            .map_err(Error::db(self.ctx("decoding extended leases")))
    }

    async fn completed_delete_batch(&self, params: &SweepParams) -> Result<Option<u64>> {
        let ctx = || self.ctx("deleting old completed commands");
        let begin = if self.work_in_transaction() {
            self.work.begin_with(WORK_BEGIN).await
        } else {
            self.work.begin().await
        };
        let mut tx = begin.map_err(self.db("deleting old completed commands"))?;
        // One replica sweeps at a time: the others skip the round instead of deleting the
        // same rows side by side.
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext($1))")
            .bind(format!("icq.sweep:{}", self.t))
            .fetch_one(&mut *tx)
            .await
            .map_err(Error::db(ctx()))?;
        if !locked {
            tx.rollback().await.map_err(Error::db(ctx()))?;
            return Ok(None);
        }
        let version = self.schema_version().await?;
        if version < 3 {
            let done = sqlx::query(AssertSqlSafe(self.sql.sweep.clone()))
                .bind(params.older_than.as_secs_f64())
                .bind(i64::from(params.limit))
                .execute(&mut *tx)
                .await
                .map_err(Error::db(ctx()))?;
            tx.commit().await.map_err(Error::db(ctx()))?;
            return Ok(Some(done.rows_affected()));
        }
        // Completed rows left in the table (by an icq older than version 3 during a
        // rolling upgrade, or by another program) move to history; old history goes.
        let sweep_move = if version >= 4 {
            &self.sql.sweep_move_v4
        } else {
            &self.sql.sweep_move
        };
        let moved = sqlx::query(AssertSqlSafe(sweep_move.clone()))
            .bind(i64::from(params.limit))
            .execute(&mut *tx)
            .await
            .map_err(Error::db(ctx()))?;
        let deleted = sqlx::query(AssertSqlSafe(self.sql.sweep_history.clone()))
            .bind(params.older_than.as_secs_f64())
            .bind(i64::from(params.limit))
            .execute(&mut *tx)
            .await
            .map_err(Error::db(ctx()))?;
        tx.commit().await.map_err(Error::db(ctx()))?;
        Ok(Some(moved.rows_affected() + deleted.rows_affected()))
    }

    async fn table_tidy(&self, dead_rows: u64) -> Result<Option<u64>> {
        let ctx = || self.ctx("vacuuming the commands table");
        let dead: Option<i64> = sqlx::query_scalar(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = to_regclass($1)",
        )
        .bind(&self.t)
        .fetch_optional(&self.pool)
        .await
        .map_err(Error::db(ctx()))?;
        let dead = dead.map_or(0, |n| u64::try_from(n).unwrap_or(0));
        if dead <= dead_rows {
            return Ok(None);
        }
        // Outside any transaction (VACUUM refuses one); a replica that finds another's
        // vacuum running skips the table rather than queueing behind it. A role that does
        // not own the table gets a warning from the server and nothing is done.
        sqlx::raw_sql(AssertSqlSafe(format!("VACUUM (SKIP_LOCKED) {}", self.t)))
            .execute(&self.pool)
            .await
            .map_err(Error::db(ctx()))?;
        Ok(Some(dead))
    }

    async fn activity(&self) -> Result<Activity> {
        let sql = if self.schema_version().await? >= 2 {
            &self.sql.activity
        } else {
            &self.sql.activity_v1
        };
        let query = sqlx::query(AssertSqlSafe(sql.clone()));
        let row = on_work!(self, |e| query.fetch_one(e))
            .await
            .map_err(self.db("counting due commands"))?;
        super::decode_activity(&row)
    }

    async fn activity_unpaused(&self) -> Result<Activity> {
        if self.schema_version().await? < 4 {
            return self.activity().await;
        }
        let sql = activity_sql(&self.t, &paused_filter(&self.t), true);
        let query = sqlx::query(AssertSqlSafe(sql));
        let row = on_work!(self, |e| query.fetch_one(e))
            .await
            .map_err(self.db("counting due commands"))?;
        super::decode_activity(&row)
    }

    async fn activity_in(&self, queues: Option<&[String]>) -> Result<Activity> {
        let Some(queues) = queues else {
            return self.activity().await;
        };
        super::check_queues(self.schema_version().await?, &self.table, Some(queues))?;
        let query = sqlx::query(AssertSqlSafe(self.sql.activity_in.clone())).bind(queues.to_vec());
        let row = on_work!(self, |e| query.fetch_one(e))
            .await
            .map_err(self.db("counting due commands"))?;
        super::decode_activity(&row)
    }

    async fn lease_check_many(&self, params: &LeaseCheckManyParams) -> Result<Vec<Lease>> {
        if params.leases.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, tokens) = lease_arrays(params.leases.iter());
        let query = sqlx::query(AssertSqlSafe(self.sql.check.clone()))
            .bind(ids)
            .bind(tokens);
        let rows = on_work!(self, |e| query.fetch_all(e))
            .await
            .map_err(self.db("checking leases"))?;
        rows.iter()
            .filter(|row| {
                row.try_get::<Option<bool>, _>("Pending")
                    .ok()
                    .flatten()
                    .unwrap_or(false)
            })
            .map(|row| {
                Ok(Lease {
                    id: CommandId::from(row.try_get::<Uuid, _>("Id")?),
                    token: LeaseToken(row.try_get("LockToken")?),
                })
            })
            .collect::<std::result::Result<_, sqlx::Error>>()
            .map_err(Error::db(self.ctx("decoding checked leases")))
    }

    async fn lease_others_at_head(&self, params: &LeaseOthersAtHeadParams) -> Result<u64> {
        let order = poll_order(self.schema_version().await? >= 2);
        let sql = format!(
            r#"SELECT count(*) AS others FROM (
                   SELECT "LockToken", "LockedUntil" FROM {t}
                   WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL AND "RunAt" <= now()
                   ORDER BY {order} LIMIT $1) AS head
               WHERE head."LockedUntil" > now() AND NOT (head."LockToken" BETWEEN $2 AND $3)"#,
            t = self.t
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(i64::from(params.window))
            .bind(params.low.0)
            .bind(params.high.0);
        let row = on_work!(self, |e| row.fetch_one(e))
            .await
            .map_err(Error::db(self.ctx("looking for other processors' leases")))?;
        super::decode_count(&row, "others")
    }
}

#[async_trait]
impl BenchOps for PgDriver {
    async fn bench_fill_completed(&self, params: &BenchFillCompletedParams) -> Result<()> {
        let rows = params.rows;
        let sql = format!(
            r#"INSERT INTO {} ("Type", "Payload", "CreatedAt", "RunAt", "Attempts", "ProcessedAt")
               SELECT 'bench.retained', '{{}}'::jsonb, now(), now(), 1, now()
               FROM generate_series(1::bigint, $1::bigint)"#,
            self.t
        );
        let query = sqlx::query(AssertSqlSafe(sql)).bind(i64::try_from(rows).unwrap_or(i64::MAX));
        on_pool!(self, self.pool, BEGIN, |e| query.execute(e))
            .await
            .map_err(Error::db(
                self.ctx("inserting completed rows for the benchmark"),
            ))?;
        Ok(())
    }
}

#[async_trait]
impl Lifecycle for PgDriver {
    fn engine(&self) -> Engine {
        Engine::Postgres
    }

    fn table(&self) -> &TableName {
        &self.table
    }

    async fn table_exists(&self) -> Result<bool> {
        let query =
            sqlx::query_scalar::<_, Option<String>>("SELECT to_regclass($1)::text").bind(&self.t);
        let found = on_pool!(self, self.pool, BEGIN, |e| query.fetch_one(e))
            .await
            .map_err(self.db("looking up the commands table"))?;
        Ok(found.is_some())
    }

    async fn schema_version(&self) -> Result<u32> {
        self.version
            .get(async {
                let query = sqlx::query_as::<_, (Option<bool>, Option<bool>, Option<bool>)>(
                    r#"SELECT EXISTS (SELECT 1 FROM pg_attribute
                                      WHERE attrelid = c AND attname = 'Queue' AND NOT attisdropped),
                              to_regclass($2) IS NOT NULL,
                              EXISTS (SELECT 1 FROM pg_attribute
                                      WHERE attrelid = c AND attname = 'OrderKey' AND NOT attisdropped)
                       FROM to_regclass($1) AS c WHERE c IS NOT NULL"#,
                )
                .bind(&self.t)
                .bind(&self.h);
                on_pool!(self, self.pool, BEGIN, |e| query.fetch_optional(e))
                    .await
                    .map(|found| {
                        found.map(|(queue, history, order_key)| {
                            super::version_of(
                                queue.unwrap_or(false),
                                history.unwrap_or(false),
                                order_key.unwrap_or(false),
                            )
                        })
                    })
                    .map_err(self.db("looking up the table's schema version"))
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
        notify: Arc<Notify>,
        cancelled: Arc<Notify>,
        queues_changed: Arc<Notify>,
    ) -> Result<bool> {
        if self.pooler == Pooler::Transaction {
            tracing::info!(
                table = %self.table,
                "pooler: transaction: no LISTEN (a transaction pooler cannot keep one) and \
                 no server-side prepared statements; new commands are found by polling \
                 every polling_interval_seconds"
            );
            return Ok(false);
        }
        let channel = self.table.notify_channel();
        let cancel_channel = self.table.cancel_channel();
        // A pool of one that follows the failover: when its connection is lost, the
        // listener reconnects through it (to the server in use then; never to one in
        // recovery) and LISTENs again.
        let pool = self
            .failover
            .pool_options(1, Duration::from_secs(10), false, self.pooler)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_lazy_with(self.failover.current_options());
        self.failover.adopt(&pool);
        let mut listener = PgListener::connect_with(&pool)
            .await
            .map_err(self.db("opening the LISTEN connection"))?;
        listener.ignore_pool_close_event(true);
        // Both channels on the one connection: a reconnect LISTENs on both again.
        listener
            .listen_all([channel.as_str(), cancel_channel.as_str()])
            .await
            .map_err(self.db("subscribing to insert and cancel notifications"))?;
        let table = self.table.to_string();
        let failover = self.failover.clone();
        let task = tokio::spawn(async move {
            loop {
                match listener.try_recv().await {
                    Ok(Some(note)) if note.channel() == cancel_channel => {
                        if note.payload() == crate::engine::control::QUEUES_CHANGED {
                            queues_changed.notify_one();
                        } else {
                            cancelled.notify_one();
                        }
                    }
                    Ok(Some(_)) => notify.notify_one(),
                    Ok(None) => {
                        // Reconnected on the next call, to the server in use then.
                        tracing::warn!(table, "LISTEN connection lost; reconnecting");
                        failover.poke();
                        // Anything committed while disconnected is found by this claim,
                        // and a cancel missed meanwhile by this lease check.
                        notify.notify_one();
                        cancelled.notify_one();
                        queues_changed.notify_one();
                    }
                    Err(err) => {
                        tracing::warn!(
                            table,
                            error = %crate::redact::redact_text(&err.to_string()),
                            "cannot LISTEN; trying again"
                        );
                        failover.saw(&err);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        notify.notify_one();
                    }
                }
            }
        });
        if let Ok(mut slot) = self.listener.lock()
            && let Some(old) = slot.replace(task)
        {
            old.abort();
        }
        tracing::debug!(table = %self.table, server = %self.failover.current_label(), "LISTEN on");
        Ok(true)
    }

    fn answer_lost(&self) {
        self.failover.poke();
    }

    async fn close(&self) {
        if let Ok(mut slot) = self.listener.lock()
            && let Some(task) = slot.take()
        {
            task.abort();
        }
        self.failover.stop();
        if !self.shared_pool {
            self.work.close().await;
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

impl super::sealed::Database for sqlx::Postgres {
    async fn driver(pool: &PgPool, table: &TableName) -> Result<Arc<dyn super::Backend>> {
        Ok(Arc::new(PgDriver::from_pool(pool.clone(), table).await?))
    }
}

impl super::sealed::Connection for PgConnection {}

#[async_trait]
impl crate::Enqueue for PgConnection {
    fn engine(&self) -> Engine {
        Engine::Postgres
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

#[cfg(all(test, feature = "driver-suite"))]
mod tests {
    //! The driver's own claim statements, planned by a real PostgreSQL (a server test:
    //! built with the driver conformance suite).

    use sqlx::Connection as _;

    use super::*;
    use crate::engine::QueueFilter;

    /// `EXPLAIN (FORMAT JSON)` of the claim of shape `key` with a claim's parameters
    /// bound (limit `limit`), plus five empty stamp arrays and the filters of `key`.
    async fn plan(conn: &mut sqlx::PgConnection, t: &str, key: ClaimKey, limit: u32) -> String {
        let explain = format!("EXPLAIN (FORMAT JSON) {}", claim_sql(t, "\"unused\"", key));
        let queues: Option<Arc<[String]>> = match key.queues {
            QueueFilter::All => None,
            QueueFilter::One => Some(vec!["q1".to_owned()].into()),
            QueueFilter::Many => Some(vec!["q1".to_owned(), "q2".to_owned()].into()),
        };
        let params = ClaimParams {
            limit,
            lease: Duration::from_secs(60),
            processing_delay: Duration::ZERO,
            token: LeaseToken::new(),
            types: key.types.then(|| vec!["t".to_owned()].into()),
            queues,
            spread: false,
            skip_paused: false,
        };
        let mut query = bind_claim(sqlx::query(sqlx::AssertSqlSafe(explain)), &params);
        if key.stamp {
            query = StampArrays::new(&[], false, key.v4).bind(query);
        }
        let after = key
            .after
            .then(|| (0, Utc::now() - chrono::Duration::hours(1), Uuid::nil()));
        let query = PgDriver::bind_filters(query, &params, key, after);
        let row = query
            .fetch_one(&mut *conn)
            .await
            .expect("explain the claim");
        let plan: serde_json::Value = row.try_get(0).expect("plan json");
        plan.to_string()
    }

    /// A claim of many rows used to hash-join against a sequential scan of the whole
    /// table (O(table) per claim: a batch of 200 drained at half the rate of 50). Every
    /// claim size must find its rows through indexes, with a large retained history: the
    /// due prefix through the poll index (or, for one queue, the queue poll index), in its
    /// order (no sort), the rows by key. The backlog (12,000 due rows in three queues)
    /// is larger than every claim: a claim of the whole due set may rightly sort it. On
    /// a version-1 table, its poll index in `RunAt` order; on version 2, `Priority`,
    /// `RunAt`, `Id`.
    #[tokio::test]
    async fn claim_statements_never_scan_the_whole_table() {
        let url = std::env::var("ICQ_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let mut conn = sqlx::PgConnection::connect(&url)
            .await
            .expect("PostgreSQL on 127.0.0.1:5432 (bash .ci/run starts it)");
        for v2 in [false, true] {
            let name = format!("icq_claim_plan_{}_{}", std::process::id(), u8::from(v2));
            let table = TableName::parse(&name).unwrap();
            let t = table.quoted(Engine::Postgres);
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP TABLE IF EXISTS {t} CASCADE"
            )))
            .execute(&mut conn)
            .await
            .unwrap();
            let ddl = if v2 {
                crate::schema::render(Engine::Postgres, &table)
            } else {
                crate::schema::render_v1(Engine::Postgres, &table)
            };
            sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.up))
                .execute(&mut conn)
                .await
                .unwrap();
            let fill = if v2 {
                format!(
                    r#"INSERT INTO {t} ("Type", "Payload", "ProcessedAt", "Queue", "Priority")
                       SELECT 't', '{{}}', CASE WHEN n % 4 = 0 THEN NULL ELSE now() END,
                              CASE WHEN n % 3 = 0 THEN 'q0' ELSE 'q1' END, (n % 5)::int2
                       FROM generate_series(1, 48000) AS n;
                       ANALYZE {t};"#
                )
            } else {
                format!(
                    r#"INSERT INTO {t} ("Type", "Payload", "ProcessedAt")
                       SELECT 't', '{{}}', CASE WHEN n % 4 = 0 THEN NULL ELSE now() END
                       FROM generate_series(1, 48000) AS n;
                       ANALYZE {t};"#
                )
            };
            sqlx::raw_sql(sqlx::AssertSqlSafe(fill))
                .execute(&mut conn)
                .await
                .unwrap();

            let base = ClaimKey {
                v2,
                history: false,
                v4: false,
                stamp: false,
                types: false,
                queues: QueueFilter::All,
                after: false,
                unusable: !v2,
                paused: false,
            };
            let mut shapes = vec![
                ("claim", base),
                (
                    "claim after the cursor",
                    ClaimKey {
                        after: true,
                        ..base
                    },
                ),
            ];
            if v2 {
                let one = ClaimKey {
                    queues: QueueFilter::One,
                    ..base
                };
                shapes.push(("claim of one queue", one));
                shapes.push((
                    "claim of one queue and some types",
                    ClaimKey { types: true, ..one },
                ));
            }
            let mut plans = Vec::new();
            for limit in [1, 50, 200, 1000, 3000] {
                for (what, key) in &shapes {
                    for stamp in [false, true] {
                        let key = ClaimKey { stamp, ..*key };
                        let what = if stamp {
                            format!("stamp and {what}")
                        } else {
                            (*what).to_owned()
                        };
                        plans.push((limit, what, key, plan(&mut conn, &t, key, limit).await));
                    }
                }
            }
            // The claims that also take the rows no claim in order settles (now and then
            // on version 2), and those of several queues: never a scan of the table.
            let mut occasional = Vec::new();
            if v2 {
                for key in [
                    ClaimKey {
                        unusable: true,
                        ..base
                    },
                    ClaimKey {
                        unusable: true,
                        stamp: true,
                        ..base
                    },
                    ClaimKey {
                        queues: QueueFilter::Many,
                        ..base
                    },
                    ClaimKey {
                        queues: QueueFilter::Many,
                        stamp: true,
                        ..base
                    },
                ] {
                    occasional.push((
                        format!("claim {key:?}"),
                        plan(&mut conn, &t, key, 200).await,
                    ));
                }
            }
            // The idle check's count, which the end of every drain runs with statistics
            // that still remember the backlog.
            let sql = Sql::new(&t, "\"unused\"");
            let counts = if v2 {
                vec![
                    ("activity", sql.activity.to_string()),
                    ("activity of queues", sql.activity_in.to_string()),
                ]
            } else {
                vec![("activity", sql.activity_v1.to_string())]
            };
            for (what, count) in counts {
                let explain = format!("EXPLAIN (FORMAT JSON) {count}");
                let mut query = sqlx::query(sqlx::AssertSqlSafe(explain));
                if what == "activity of queues" {
                    query = query.bind(vec!["q1".to_owned()]);
                }
                let row = query.fetch_one(&mut conn).await.expect("explain the count");
                let plan: serde_json::Value = row.try_get(0).expect("plan json");
                occasional.push((what.to_owned(), plan.to_string()));
            }
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE {t} CASCADE")))
                .execute(&mut conn)
                .await
                .unwrap();
            for (limit, what, key, plan) in plans {
                let index = if key.queues == QueueFilter::One {
                    format!("IX_{name}_QueuePoll")
                } else {
                    format!("IX_{name}_Poll")
                };
                assert!(
                    !plan.contains("Seq Scan"),
                    "the {what} statement for {limit} rows (v2: {v2}) scans the whole table:\n{plan}"
                );
                assert!(
                    plan.contains(&format!("\"{index}\"")),
                    "the {what} statement for {limit} rows (v2: {v2}) does not use {index}:\n{plan}"
                );
                assert!(
                    !plan.contains(r#""Node Type":"Sort""#)
                        && !plan.contains(r#""Node Type":"Incremental Sort""#),
                    "the poll index should deliver claim order to the {what} statement (v2: {v2}):\n{plan}"
                );
            }
            for (what, plan) in occasional {
                assert!(
                    !plan.contains("Seq Scan"),
                    "the {what} statement (v2: {v2}) scans the whole table:\n{plan}"
                );
            }
        }
    }

    /// The processor's statements use generic plans, never compiled (`jit = off`), and
    /// commit with the server's `synchronous_commit` whichever way the driver was made —
    /// icq's own pools, or the application's pool — and the application's own statements
    /// on its pool keep the server's settings.
    #[tokio::test]
    async fn work_plans_generically_and_commits_durably_on_both_construction_paths() {
        let url = std::env::var("ICQ_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let name = format!("icq_sync_{}", std::process::id());
        let table = TableName::parse(&name).unwrap();
        let t = table.quoted(Engine::Postgres);
        let app = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(&url)
            .await
            .expect("PostgreSQL on 127.0.0.1:5432");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {t} CASCADE"
        )))
        .execute(&app)
        .await
        .unwrap();
        let ddl = crate::schema::render(Engine::Postgres, &table);
        sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.up))
            .execute(&app)
            .await
            .unwrap();
        let server: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&app)
            .await
            .unwrap();
        let server_jit: String = sqlx::query_scalar("SHOW jit")
            .fetch_one(&app)
            .await
            .unwrap();
        let own = PgDriver::connect(&url, &table, &ConnectOptions::default())
            .await
            .unwrap();
        let shared = PgDriver::from_pool(app.clone(), &table).await.unwrap();
        for (how, driver) in [("Queue::connect", &own), ("Queue::from_pool", &shared)] {
            let shown: String = on_work!(driver, |e| sqlx::query_scalar::<_, String>(
                "SHOW synchronous_commit"
            )
            .fetch_one(e))
            .await
            .unwrap();
            assert_eq!(shown, server, "{how}: the processor's commits");
            let plans: String = on_work!(driver, |e| sqlx::query_scalar::<_, String>(
                "SHOW plan_cache_mode"
            )
            .fetch_one(e))
            .await
            .unwrap();
            assert_eq!(plans, "force_generic_plan", "{how}: the processor's plans");
            let jit: String = on_work!(driver, |e| sqlx::query_scalar::<_, String>("SHOW jit")
                .fetch_one(e))
            .await
            .unwrap();
            assert_eq!(
                jit, "off",
                "{how}: the processor's plans are never compiled"
            );
        }
        // The application's connections are as the server set them, before and after.
        for _ in 0..4 {
            let shown: String = sqlx::query_scalar("SHOW synchronous_commit")
                .fetch_one(&app)
                .await
                .unwrap();
            assert_eq!(shown, server, "the application's own statements");
            let plans: String = sqlx::query_scalar("SHOW plan_cache_mode")
                .fetch_one(&app)
                .await
                .unwrap();
            assert_eq!(plans, "auto", "the application's own plans");
            let jit: String = sqlx::query_scalar("SHOW jit")
                .fetch_one(&app)
                .await
                .unwrap();
            assert_eq!(jit, server_jit, "the application's own JIT setting");
        }
        own.close().await;
        shared.close().await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE {t} CASCADE")))
            .execute(&app)
            .await
            .unwrap();
    }
}

#[cfg(all(test, feature = "driver-suite"))]
mod history_tests {
    //! Schema version 3 on a real PostgreSQL: what the claims' table costs per command.

    use std::time::Duration;

    use sqlx::Connection as _;

    use super::*;
    use crate::engine::admin::{AdminOps, CommandListParams, ListState};
    use crate::engine::{QueueFilter, StateChange};

    fn url() -> String {
        std::env::var("ICQ_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
    }

    async fn fresh(tag: &str) -> (TableName, PgDriver, sqlx::PgConnection) {
        let name = format!("icq_hist_{tag}_{}", std::process::id());
        let table = TableName::parse(&name).unwrap();
        let mut conn = sqlx::PgConnection::connect(&url())
            .await
            .expect("PostgreSQL");
        let ddl = crate::schema::render(Engine::Postgres, &table);
        sqlx::raw_sql(AssertSqlSafe(format!("{}\n{}", ddl.down, ddl.up)))
            .execute(&mut conn)
            .await
            .unwrap();
        let driver = PgDriver::connect(&url(), &table, &ConnectOptions::default())
            .await
            .expect("driver");
        (table, driver, conn)
    }

    /// Drops what [`fresh`] created.
    async fn drop_table(conn: &mut sqlx::PgConnection, table: &TableName) {
        sqlx::raw_sql(AssertSqlSafe(
            crate::schema::render(Engine::Postgres, table).down,
        ))
        .execute(conn)
        .await
        .unwrap();
    }

    /// A claim of `limit` rows of any type and queue, with a 60 s lease.
    fn claim_of(limit: u32) -> ClaimParams {
        ClaimParams {
            limit,
            lease: Duration::from_secs(60),
            processing_delay: Duration::ZERO,
            token: LeaseToken::new(),
            types: None,
            queues: None,
            spread: false,
            skip_paused: false,
        }
    }

    /// `EXPLAIN (ANALYZE, FORMAT JSON)` of a claim of shape `key` (limit 50), run and
    /// rolled back.
    async fn analyzed(conn: &mut sqlx::PgConnection, t: &str, key: ClaimKey) -> serde_json::Value {
        let explain = format!(
            "EXPLAIN (ANALYZE, FORMAT JSON) {}",
            claim_sql(t, "\"unused\"", key)
        );
        let params = claim_of(50);
        let mut tx = conn.begin().await.unwrap();
        let row = bind_claim(sqlx::query(sqlx::AssertSqlSafe(explain)), &params)
            .fetch_one(&mut *tx)
            .await
            .expect("explain the claim");
        tx.rollback().await.unwrap();
        row.try_get(0).expect("plan json")
    }

    /// Every plan node of `plan` (depth first).
    fn nodes(plan: &serde_json::Value, out: &mut Vec<serde_json::Value>) {
        if let Some(plan) = plan.get("Plan") {
            nodes(plan, out);
        }
        if plan.get("Node Type").is_some() {
            out.push(plan.clone());
        }
        if let Some(children) = plan.get("Plans").and_then(|p| p.as_array()) {
            for child in children {
                nodes(child, out);
            }
        }
        if let Some(list) = plan.as_array() {
            for item in list {
                nodes(item, out);
            }
        }
    }

    /// `EXPLAIN (FORMAT JSON)` of `sql`'s generic plan, as a work session's prepared
    /// statement gets it (the session forces generic plans), every parameter NULL.
    async fn generic_plan(conn: &mut sqlx::PgConnection, sql: &str) -> serde_json::Value {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DEALLOCATE ALL; PREPARE icq_generic AS {sql}"
        )))
        .execute(&mut *conn)
        .await
        .unwrap();
        let types: Vec<String> = sqlx::query_scalar(
            "SELECT unnest(parameter_types)::text FROM pg_prepared_statements
             WHERE name = 'icq_generic'",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        let nulls: Vec<String> = types.iter().map(|ty| format!("NULL::{ty}")).collect();
        sqlx::query_scalar(AssertSqlSafe(format!(
            "EXPLAIN (FORMAT JSON) EXECUTE icq_generic({})",
            nulls.join(", ")
        )))
        .fetch_one(&mut *conn)
        .await
        .unwrap()
    }

    /// Turns the server's autovacuum off for `t`, then inserts `rows` rows and deletes
    /// them: dead row versions only icq's tidy (or a test's own vacuum) clears.
    async fn leave_dead_rows(conn: &mut sqlx::PgConnection, t: &str, rows: u32) {
        sqlx::raw_sql(AssertSqlSafe(format!(
            r#"ALTER TABLE {t} SET (autovacuum_enabled = false);
               INSERT INTO {t} ("Type", "Payload") SELECT 't', '{{}}' FROM generate_series(1, {rows});
               DELETE FROM {t};"#
        )))
        .execute(conn)
        .await
        .unwrap();
    }

    /// Stamps (both forms, alone and with a claim), lease renewals and checks read each
    /// row through the primary key, in their generic plans, even when the statistics say
    /// the table is empty: a vacuum that found no live row while a held horizon kept every
    /// dead one sets `reltuples` to 0, and a plain join's generic plan then walked the
    /// whole primary key, dead entries and all.
    #[tokio::test]
    async fn row_lookups_by_id_use_the_key_when_the_statistics_say_empty() {
        let (table, driver, mut conn) = fresh("empty_stats").await;
        let t = driver.t.clone();
        let mut hold = sqlx::PgConnection::connect(&url())
            .await
            .expect("PostgreSQL");
        sqlx::raw_sql("BEGIN; SELECT txid_current()")
            .execute(&mut hold)
            .await
            .unwrap();
        leave_dead_rows(&mut conn, &t, 20_000).await;
        sqlx::raw_sql(AssertSqlSafe(format!("VACUUM {t}")))
            .execute(&mut conn)
            .await
            .unwrap();
        let reltuples: f32 =
            sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE oid = $1::regclass")
                .bind(&t)
                .fetch_one(&mut conn)
                .await
                .unwrap();
        assert_eq!(reltuples, 0.0, "the vacuum under the hold counts no row");
        sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
            .execute(&mut conn)
            .await
            .unwrap();
        let mut plans: Vec<(String, serde_json::Value)> = Vec::new();
        let mut statements = vec![
            ("lease renewal".to_owned(), driver.sql.extend.clone()),
            ("lease check".to_owned(), driver.sql.check.clone()),
        ];
        for version in 1..=4 {
            let stamp = driver.sql.set_state(version);
            statements.push((format!("stamp v{version}"), stamp.first.clone()));
            statements.push((format!("stamp again v{version}"), stamp.again.clone()));
        }
        for version in [3, 4] {
            let key = ClaimKey {
                v2: true,
                history: true,
                v4: version == 4,
                stamp: true,
                types: false,
                queues: QueueFilter::All,
                after: false,
                paused: false,
                unusable: false,
            };
            statements.push((
                format!("stamp and claim v{version}"),
                claim_sql(&t, &driver.h, key).into(),
            ));
        }
        for (what, sql) in statements {
            let plan = generic_plan(&mut conn, &sql).await;
            plans.push((what, plan));
        }
        for (what, plan) in &plans {
            let mut all = Vec::new();
            nodes(plan, &mut all);
            let looked_up: Vec<&serde_json::Value> = all
                .iter()
                .filter(|node| {
                    node.get("Relation Name").and_then(|n| n.as_str()) == Some(table.name())
                        && node.get("Index Name").and_then(|n| n.as_str())
                            == Some(format!("{}_pkey", table.name()).as_str())
                })
                .collect();
            assert!(!looked_up.is_empty(), "{what}: the key is used: {plan}");
            for node in looked_up {
                let cond = node
                    .get("Index Cond")
                    .and_then(|c| c.as_str())
                    .unwrap_or("");
                assert!(
                    cond.contains("\"Id\""),
                    "{what}: the key is searched, not walked: {plan}"
                );
            }
            let scanned = all.iter().any(|node| {
                node.get("Relation Name").and_then(|n| n.as_str()) == Some(table.name())
                    && node.get("Node Type").and_then(|n| n.as_str()) == Some("Seq Scan")
            });
            assert!(!scanned, "{what}: no scan of the table: {plan}");
            if what.starts_with("stamp v") {
                // The first form reaches each row by the key, then by its address.
                for node in all.iter().filter(|node| {
                    node.get("Relation Name").and_then(|n| n.as_str()) == Some(table.name())
                        && node.get("Node Type").and_then(|n| n.as_str()) != Some("ModifyTable")
                }) {
                    let by_key = node.get("Index Name").and_then(|n| n.as_str())
                        == Some(format!("{}_pkey", table.name()).as_str());
                    let by_address = node.get("Node Type").and_then(|n| n.as_str())
                        == Some("Tid Scan")
                        && node
                            .get("TID Cond")
                            .and_then(|c| c.as_str())
                            .is_some_and(|c| c.contains("ctid"));
                    assert!(
                        by_key || by_address,
                        "{what}: the table is reached by key or address only: {plan}"
                    );
                }
            }
        }
        sqlx::raw_sql("ROLLBACK").execute(&mut hold).await.unwrap();
        drop_table(&mut conn, &table).await;
    }

    /// A stamp finds each row in its snapshot and reaches it by its physical address;
    /// when another transaction updates a leased row after that snapshot (a lease renewal
    /// in flight, another program), the server skips the newer version there, and the
    /// stamp's second form must still stamp it, once. A row whose token changed meanwhile
    /// stays as the other transaction left it.
    #[tokio::test]
    async fn a_row_updated_while_its_stamp_waits_is_still_stamped_once() {
        let (table, driver, mut conn) = fresh("restamp").await;
        let t = driver.t.clone();
        let h = driver.h.clone();
        sqlx::raw_sql(AssertSqlSafe(format!(
            r#"INSERT INTO {t} ("Type", "Payload") SELECT 't', '{{}}' FROM generate_series(1, 4)"#
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        let claimed = driver.command_claim(&claim_of(4)).await.expect("claim");
        assert_eq!(claimed.len(), 4);
        let lease = |i: usize| claimed[i].lease.clone();
        let id = |i: usize| claimed[i].lease.id.as_uuid().unwrap();
        // Rows 0 (completed) and 1 (retried) are renewed meanwhile, row 2's token is
        // taken by someone else, row 3 (completed) is left alone.
        let mut other = sqlx::PgConnection::connect(&url())
            .await
            .expect("PostgreSQL");
        sqlx::raw_sql("BEGIN").execute(&mut other).await.unwrap();
        sqlx::query(AssertSqlSafe(format!(
            r#"UPDATE {t} SET "LockedUntil" = "LockedUntil" + interval '1 minute'
               WHERE "Id" = ANY($1)"#
        )))
        .bind(vec![id(0), id(1)])
        .execute(&mut other)
        .await
        .unwrap();
        sqlx::query(AssertSqlSafe(format!(
            r#"UPDATE {t} SET "LockToken" = gen_random_uuid() WHERE "Id" = $1"#
        )))
        .bind(id(2))
        .execute(&mut other)
        .await
        .unwrap();
        let retry = StateChange::Retry {
            delay: Duration::from_secs(30),
            error: "boom".into(),
            errors: None,
        };
        let changes = vec![
            SetState {
                lease: lease(0),
                change: StateChange::Completed,
            },
            SetState {
                lease: lease(1),
                change: retry,
            },
            SetState {
                lease: lease(2),
                change: StateChange::Completed,
            },
            SetState {
                lease: lease(3),
                change: StateChange::Completed,
            },
        ];
        let stamping = tokio::spawn(async move {
            let stamped = driver
                .command_set_state_many(&CommandSetStateManyParams { changes: &changes })
                .await;
            (driver, stamped)
        });
        // Only a session blocked by `other` counts: other tests' stamps may wait too.
        let blocker: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut other)
            .await
            .unwrap();
        let mut waited = false;
        for _ in 0..1200 {
            waited = sqlx::query_scalar(
                "SELECT count(*) > 0 FROM pg_stat_activity
                 WHERE $1 = ANY(pg_blocking_pids(pid)) AND query LIKE '%stamps AS%'",
            )
            .bind(blocker)
            .fetch_one(&mut conn)
            .await
            .unwrap();
            if waited {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(
            waited,
            "the stamp waits for the rows the other transaction holds"
        );
        sqlx::raw_sql("COMMIT").execute(&mut other).await.unwrap();
        let (driver, stamped) = stamping.await.unwrap();
        assert_eq!(stamped.expect("stamp"), 3, "rows 0, 1 and 3 are stamped");
        let left: Vec<(Uuid, Option<String>, bool)> = sqlx::query_as(AssertSqlSafe(format!(
            r#"SELECT "Id", "LastError", "LockToken" IS NOT NULL FROM {t} ORDER BY "Id""#
        )))
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let mut expected = vec![(id(1), Some("boom".to_owned()), false), (id(2), None, true)];
        expected.sort();
        assert_eq!(
            left, expected,
            "the retried row and the row taken meanwhile stay"
        );
        let retried: (i32, bool) = sqlx::query_as(AssertSqlSafe(format!(
            r#"SELECT "Attempts", "RunAt" > now() + interval '20 s' FROM {t} WHERE "Id" = $1"#
        )))
        .bind(id(1))
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert_eq!(
            retried,
            (1, true),
            "the retry's attempt kept, its delay applied"
        );
        let moved: Vec<Uuid> = sqlx::query_scalar(AssertSqlSafe(format!(
            r#"SELECT "Id" FROM {h} ORDER BY "Id""#
        )))
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let mut done = vec![id(0), id(3)];
        done.sort();
        assert_eq!(moved, done, "the completed rows moved to history once");
        driver.close().await;
        drop_table(&mut conn, &table).await;
    }

    /// The ordered-key condition of a version-4 claim runs only for rows with an
    /// `OrderKey` (a backlog without keys never executes it), and for those it is a seek
    /// in `IX_<t>_OrderKey`: no scan of the table, whatever share of rows carry a key.
    #[tokio::test]
    async fn the_order_key_condition_costs_rows_without_a_key_nothing() {
        let (table, driver, mut conn) = fresh("ordered").await;
        let t = &driver.t;
        sqlx::raw_sql(AssertSqlSafe(format!(
            r#"INSERT INTO {t} ("Type", "Payload") SELECT 't', '{{}}' FROM generate_series(1, 48000);
               ANALYZE {t};"#
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        let key = ClaimKey {
            v2: true,
            history: true,
            stamp: false,
            types: false,
            queues: crate::engine::QueueFilter::All,
            after: false,
            v4: true,
            unusable: false,
            paused: false,
        };
        let subplans = |plan: &serde_json::Value| {
            let mut all = Vec::new();
            nodes(plan, &mut all);
            all.into_iter()
                .filter(|n| n["Parent Relationship"] == "SubPlan")
                .collect::<Vec<_>>()
        };
        let plan = analyzed(&mut conn, t, key).await;
        let unkeyed = subplans(&plan);
        assert_eq!(unkeyed.len(), 1, "{plan}");
        assert_eq!(
            unkeyed[0]["Actual Loops"], 0,
            "never run without keys: {plan}"
        );

        // One row in ten gets one of seven keys.
        sqlx::raw_sql(AssertSqlSafe(format!(
            r#"UPDATE {t} SET "OrderKey" = 'k' || (hashtext("Id"::text) % 7)
               WHERE hashtext("Id"::text) % 10 = 0;
               ANALYZE {t};"#
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        let plan = analyzed(&mut conn, t, key).await;
        let keyed = subplans(&plan);
        let index = format!("IX_{}_OrderKey", table.name());
        assert_eq!(keyed[0]["Index Name"], index.as_str(), "{plan}");
        let text = plan.to_string();
        assert!(!text.contains("Seq Scan"), "{plan}");
        let loops = keyed[0]["Actual Loops"].as_u64().unwrap();
        assert!(
            (1..=60).contains(&loops),
            "one seek per keyed row looked at: {plan}"
        );
        let ms = plan[0]["Execution Time"].as_f64().unwrap();
        eprintln!("claim of 50 with one row in ten keyed: {loops} seeks, {ms:.2} ms");
    }

    /// Claims and lease renewals change no indexed column, so on the table's
    /// `fillfactor = 80` pages they are HOT updates: no index entry and no dead index
    /// tuple per claim (the stamp deletes the row, moving it to history). One claim of
    /// more rows than a page's free space holds cannot be all HOT (the old versions die
    /// only when it commits); claims of a processor's batch are.
    #[tokio::test]
    async fn claims_and_lease_renewals_are_hot_updates() {
        let (table, driver, mut conn) = fresh("hot").await;
        let t = &driver.t;
        sqlx::raw_sql(AssertSqlSafe(format!(
            r#"INSERT INTO {t} ("Type", "Payload") SELECT 't', '{{}}' FROM generate_series(1, 200)"#
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        // A processor's pace: claims of ten, each batch's leases renewed.
        for _ in 0..20 {
            let params = claim_of(10);
            let claimed = driver.command_claim(&params).await.expect("claim");
            assert_eq!(claimed.len(), 10);
            let leases: Vec<Lease> = claimed.iter().map(|c| c.lease.clone()).collect();
            let extended = driver
                .lease_extend_many(&LeaseExtendManyParams {
                    leases,
                    lease: Duration::from_secs(120),
                })
                .await
                .expect("extend");
            assert_eq!(extended.len(), 10);
        }
        driver.close().await;
        // The driver's backends report their counts when they go idle or close.
        let mut seen = (0, 0);
        for _ in 0..60 {
            sqlx::query("SET stats_fetch_consistency = none")
                .execute(&mut conn)
                .await
                .unwrap();
            seen = sqlx::query_as::<_, (i64, i64)>(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = $1::regclass",
            )
            .bind(t)
            .fetch_one(&mut conn)
            .await
            .unwrap();
            if seen.0 >= 400 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        drop_table(&mut conn, &table).await;
        assert!(seen.0 >= 400, "updates not reported: {seen:?}");
        // Page pruning makes room for the new versions as the old ones die; a version
        // that finds its page full is the only non-HOT one. Alone, every one is HOT; a
        // transaction elsewhere (another test) holding the xmin horizon keeps the old
        // versions alive and some pages fill up.
        assert!(
            seen.1 * 2 >= seen.0,
            "claims and renewals are HOT updates (updates, HOT): {seen:?}"
        );
    }

    /// Dead row versions past the bound are vacuumed away by icq itself, whatever the
    /// server's autovacuum does; under the bound nothing runs.
    #[tokio::test]
    async fn the_tidy_vacuums_dead_rows_past_its_bound() {
        let (table, driver, mut conn) = fresh("tidy").await;
        let t = &driver.t;
        leave_dead_rows(&mut conn, t, 3_000).await;
        let dead = || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass",
            )
            .bind(t)
            .fetch_one(&driver.pool)
            .await
            .unwrap()
        };
        // This connection reports its deletes when it goes idle.
        let mut before = 0;
        for _ in 0..60 {
            before = dead().await;
            if before >= 3000 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(before >= 3000, "the deletes were not reported: {before}");
        assert_eq!(
            driver.table_tidy(1_000_000).await.unwrap(),
            None,
            "under the bound"
        );
        let tidied = driver.table_tidy(1000).await.unwrap();
        assert!(tidied.is_some_and(|n| n >= 3000), "{tidied:?}");
        // Another test's open transaction may hold the horizon for a while: vacuum again
        // until it has passed.
        let mut after = before;
        for _ in 0..120 {
            after = dead().await;
            if after == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            let _ = driver.table_tidy(0).await.unwrap();
        }
        driver.close().await;
        drop_table(&mut conn, &table).await;
        assert_eq!(after, 0, "dead rows after the vacuum");
    }

    /// The completed listing of a version-3 table reads the table and its history as one;
    /// each branch through its own index (the history's `ProcessedAt`, the table's
    /// retention index), never a scan of either, at any page.
    #[tokio::test]
    async fn the_completed_listing_uses_both_tables_indexes() {
        let (table, driver, mut conn) = fresh("list").await;
        let (t, h) = (&driver.t, &driver.h);
        sqlx::raw_sql(AssertSqlSafe(format!(
            r#"INSERT INTO {h} ("Id", "Type", "Payload", "ProcessedAt")
                   SELECT gen_random_uuid(), 't', '{{}}', now() - n * interval '1 second'
                   FROM generate_series(1, 30000) AS n;
               INSERT INTO {t} ("Type", "Payload", "ProcessedAt")
                   SELECT 't', '{{}}', CASE WHEN n % 100 = 0 THEN now() END
                   FROM generate_series(1, 30000) AS n;
               ANALYZE {h}; ANALYZE {t};"#
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        let page = |after| CommandListParams {
            state: ListState::Completed,
            type_name: None,
            queue: None,
            limit: 50,
            after,
            before: None,
        };
        let first = driver.command_list(&page(None)).await.expect("list");
        assert_eq!(first.len(), 50);
        let rows = driver.all_rows().await.unwrap();
        let mut plans = Vec::new();
        for params in [page(None), page(Some(first[49].id.clone()))] {
            let sql = crate::engine::admin::numbered_list_sql(
                &rows,
                &params,
                r#""ProcessedAt" IS NOT NULL"#.to_owned(),
                '$',
                false,
            );
            let mut query =
                sqlx::query(AssertSqlSafe(format!("EXPLAIN (FORMAT JSON) {sql}"))).bind(50_i64);
            if let Some(after) = &params.after {
                query = query.bind(after.as_uuid().unwrap());
            }
            let row = query.fetch_one(&mut conn).await.expect("explain");
            let plan: serde_json::Value = row.try_get(0).unwrap();
            plans.push(plan.to_string());
        }
        driver.close().await;
        drop_table(&mut conn, &table).await;
        let name = table.name();
        for plan in plans {
            assert!(
                !plan.contains("Seq Scan"),
                "a branch scans its table:\n{plan}"
            );
            assert!(plan.contains(&format!("IX_{name}_History")), "{plan}");
            assert!(plan.contains(&format!("IX_{name}_Retention")), "{plan}");
        }
    }

    /// The lease check's generic plan (the work sessions force generic plans) looks each
    /// lease up by primary key even on a table without statistics, where a pending
    /// condition in its `WHERE` made it walk a poll index's every pending row per lease.
    #[tokio::test]
    async fn the_lease_check_reads_by_primary_key_before_any_analyze() {
        let (table, driver, mut conn) = fresh("check_plan").await;
        let t = table.quoted(Engine::Postgres);
        sqlx::raw_sql(AssertSqlSafe(format!(
            r#"ALTER TABLE {t} SET (autovacuum_enabled = false);
               INSERT INTO {t} ("Type", "Payload", "Queue")
                 SELECT 'work', '{{}}', 'q' FROM generate_series(1, 20000);
               UPDATE {t} SET "LockToken" = gen_random_uuid(), "LockedUntil" = now() + interval '20 s'
                 WHERE "Id" IN (SELECT "Id" FROM {t} LIMIT 5);
               SET plan_cache_mode = force_generic_plan"#
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        let leased: Vec<(Uuid, Uuid)> = sqlx::query_as(AssertSqlSafe(format!(
            r#"SELECT "Id", "LockToken" FROM {t} WHERE "LockToken" IS NOT NULL"#
        )))
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let (ids, tokens): (Vec<Uuid>, Vec<Uuid>) = leased.into_iter().unzip();
        let array = |list: &[Uuid]| {
            let items: Vec<String> = list.iter().map(Uuid::to_string).collect();
            format!("'{{{}}}'", items.join(","))
        };
        // The generic plan, as a work session's prepared statement gets it.
        sqlx::raw_sql(AssertSqlSafe(format!(
            "PREPARE icq_check(uuid[], uuid[]) AS {}",
            driver.sql.check
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        let plan: serde_json::Value = sqlx::query_scalar(AssertSqlSafe(format!(
            "EXPLAIN (FORMAT JSON) EXECUTE icq_check({}, {})",
            array(&ids),
            array(&tokens)
        )))
        .fetch_one(&mut conn)
        .await
        .unwrap();
        let mut all = Vec::new();
        nodes(&plan, &mut all);
        let indexes: Vec<&str> = all
            .iter()
            .filter_map(|node| node.get("Index Name").and_then(|n| n.as_str()))
            .collect();
        assert_eq!(indexes, [format!("{}_pkey", table.name())], "{plan}");
        let checked = driver
            .lease_check_many(&crate::engine::LeaseCheckManyParams {
                leases: ids
                    .iter()
                    .zip(&tokens)
                    .map(|(id, token)| Lease {
                        id: CommandId::from(*id),
                        token: LeaseToken(*token),
                    })
                    .collect(),
            })
            .await
            .unwrap();
        assert_eq!(checked.len(), 5, "every pending lease is found");
        drop_table(&mut conn, &table).await;
    }
}
