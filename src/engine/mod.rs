//! The engine seam: one trait of Noun+Verb operations that the processor and the operator
//! commands call, implemented once per engine in `postgres/`, `sqlite/` and `mysql/`.
//!
//! Every SQL statement icq runs at runtime lives in those three folders; code outside
//! `engine` never builds SQL and never matches on the engine. Outcome stamps are always
//! guarded by the lease token, so a processor whose lease expired cannot overwrite the
//! work of the one that took the row over.

pub mod admin;
pub mod control;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod cursor;
pub(crate) mod decode;
pub mod health;
pub mod limits;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
pub(crate) mod probe;
pub mod recurring;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub(crate) mod url;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::command::{CommandId, CommandRow, LeaseToken, NewCommand, Scheduled};
use crate::error::Result;
use crate::ident::{Engine, TableName};

pub use admin::AdminOps;
pub use control::ControlOps;
pub use health::HealthOps;
pub use limits::{Held, LimitedClaim, LimitedClaimParams, QueueLimits};
pub use recurring::ScheduleOps;

/// The most claims one processor runs at once on any engine (the connection pool is sized
/// for them). Measured on PostgreSQL (50,000 no-op commands, defaults, alternating runs):
/// 2 in flight drained 10,100–11,600/s, 4 drained 14,100–15,600/s.
pub const MAX_CLAIMS_IN_FLIGHT: usize = 4;

/// What to claim: the due prefix of a batch under one fresh lease token.
#[derive(Debug, Clone)]
pub struct ClaimParams {
    /// Most rows to claim (the source's `batch_size`).
    pub limit: u32,
    /// The lease: claimed rows are held until `now + lease`.
    pub lease: Duration,
    /// Rows younger than this (by `CreatedAt`) are not claimed.
    pub processing_delay: Duration,
    /// The token written into `LockToken`.
    pub token: LeaseToken,
    /// Claim only these types (`claim_only_handled_types`); `None` claims every type.
    pub types: Option<Arc<[String]>>,
    /// Claim only rows of these queues (a worker's configured `queues:`, or one of them);
    /// `None` claims every queue. Rows come in `Priority`, `RunAt`, `Id` order on a
    /// version-2 table (`RunAt`, `Id` on version 1, which has no queues: `Some` is refused
    /// there before any claim is made).
    pub queues: Option<Arc<[String]>>,
    /// Other processors hold leases at the head of the queue: a driver that keeps a claim
    /// cursor may move it to a random point among rows of the same `Priority` and `RunAt`
    /// as the head, so replicas claim apart instead of stepping over each other's rows.
    pub spread: bool,
    /// Some queue is paused (the processor's watch has seen a paused queue in
    /// `<table>Queues`): the claim skips rows of paused queues, looked up in the same
    /// statement. Without a pause the claim does not look (the common case costs nothing).
    pub skip_paused: bool,
}

/// One command to insert on its own.
#[derive(Debug, Clone, Copy)]
pub struct CommandInsertParams<'a> {
    /// The command (its id, when set, is kept).
    pub command: &'a NewCommand,
}

/// Commands to insert in bulk, in one transaction.
#[derive(Debug, Clone, Copy)]
pub struct CommandInsertManyParams<'a> {
    /// The commands, in order; the ids come back in the same order.
    pub commands: &'a [NewCommand],
}

/// The row to read.
#[derive(Debug, Clone, Copy)]
pub struct CommandGetParams<'a> {
    /// Its id, in any form a row may hold.
    pub id: &'a CommandId,
}

/// Outcome stamps to write, each guarded by its lease.
#[derive(Debug, Clone, Copy)]
pub struct CommandSetStateManyParams<'a> {
    /// One stamp per row.
    pub changes: &'a [SetState],
}

/// Outcome stamps to write and the claim to make in the same round trip.
#[derive(Debug, Clone, Copy)]
pub struct CommandSetStateAndClaimParams<'a> {
    /// One stamp per row, written first.
    pub changes: &'a [SetState],
    /// The claim made after the stamps.
    pub claim: &'a ClaimParams,
}

/// How many completed rows `icq bench` adds for its retained-history claim measurement.
#[derive(Debug, Clone, Copy)]
pub struct BenchFillCompletedParams {
    /// The number of rows.
    pub rows: u64,
}

/// Which leases to extend, and for how long from the database's `now`.
#[derive(Debug, Clone)]
pub struct LeaseExtendManyParams {
    /// The leases (id and token) still held.
    pub leases: Vec<Lease>,
    /// The new lease: each is held until `now + lease`.
    pub lease: Duration,
}

/// One claimed row's lease: the pair every outcome stamp is guarded by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The row, by its id exactly as stored.
    pub id: CommandId,
    /// The token of the claim that holds it.
    pub token: LeaseToken,
}

/// A row a claim returned: its lease and its columns, decoded one by one. A row whose
/// `defects` are not empty cannot be run and is dead-lettered on its own.
#[derive(Debug, Clone)]
pub struct ClaimedRow {
    /// The lease the claim took.
    pub lease: Lease,
    /// The row as decoded.
    pub row: CommandRow,
    /// Set when the database's own clock, read by the claim statement, says the row is
    /// not due for this long yet: it was claimed only because its stored `RunAt` sorts
    /// as due (SQLite integer time written by another program). The processor puts it
    /// back with `RunAt` rewritten instead of running it early. Never decided by the
    /// worker's clock, which may be off.
    pub not_due_for: Option<Duration>,
    /// The payload's size as the claim read it (its text; PostgreSQL's jsonb bytes): the
    /// producer's estimate of what the row holds in memory while it waits in the buffer.
    pub payload_bytes: usize,
}

/// What a stamp does to one leased row. Every kind clears the lease.
#[derive(Debug, Clone, PartialEq)]
pub enum StateChange {
    /// The handler succeeded: `ProcessedAt = now`. On a version-3 table the row moves to
    /// the history table in the same statement (PostgreSQL) or transaction, so the table
    /// the claims read keeps only the work in flight.
    Completed,
    /// The attempt failed and will be retried: `RunAt = now + delay`, `LastError` set,
    /// and on a version-4 table `Errors` set to `errors` when given.
    Retry {
        /// Delay before the next attempt.
        delay: Duration,
        /// The text stored in `LastError`.
        error: String,
        /// The new `Errors` array ([`crate::attempts::append`]), `None` to leave it.
        errors: Option<String>,
    },
    /// The row stops retrying: `DeadLetteredAt = now`, `LastError` set, and on a
    /// version-4 table `Errors` set to `errors` when given.
    Dead {
        /// The text stored in `LastError`.
        error: String,
        /// The new `Errors` array ([`crate::attempts::append`]), `None` to leave it.
        errors: Option<String>,
    },
    /// The row never started (or was stopped by shutdown): the attempt the claim consumed
    /// is given back; with `run_in`, `RunAt` moves to `now + run_in`.
    Release {
        /// Where to move `RunAt`, when it should move.
        run_in: Option<Duration>,
    },
    /// The handler asked to run later (a snooze): `RunAt = now + delay`, the attempt
    /// the claim consumed is given back, `Snoozes` grows by one, `LastError` is kept.
    Snooze {
        /// Delay before it is due again.
        delay: Duration,
    },
}

/// One row's stamp: the lease that guards it and the change.
#[derive(Debug, Clone, PartialEq)]
pub struct SetState {
    /// The row and the claim that must still hold it.
    pub lease: Lease,
    /// What to write.
    pub change: StateChange,
}

impl SetState {
    /// The numeric kind the engines' set-state statements switch on.
    pub(crate) fn kind(&self) -> i16 {
        match self.change {
            StateChange::Completed => 0,
            StateChange::Retry { .. } => 1,
            StateChange::Dead { .. } => 2,
            StateChange::Release { .. } => 3,
            StateChange::Snooze { .. } => 4,
        }
    }

    /// Seconds to add to now for the new `RunAt` (retry or release with a move), if any.
    pub(crate) fn delay_seconds(&self) -> Option<f64> {
        match &self.change {
            StateChange::Retry { delay, .. } => Some(delay.as_secs_f64()),
            StateChange::Release { run_in } => run_in.map(|d| d.as_secs_f64()),
            StateChange::Snooze { delay } => Some(delay.as_secs_f64()),
            _ => None,
        }
    }

    /// The `LastError` text this stamp writes, NUL bytes removed (no engine stores them
    /// in text) and cut to [`MAX_LAST_ERROR_BYTES`], if it writes one.
    pub(crate) fn error(&self) -> Option<String> {
        match &self.change {
            StateChange::Retry { error, .. } | StateChange::Dead { error, .. } => {
                Some(bounded(&error.replace('\0', ""), MAX_LAST_ERROR_BYTES))
            }
            _ => None,
        }
    }

    /// The `Errors` array this stamp writes (a retry or a dead-letter that carries one).
    pub(crate) fn errors(&self) -> Option<&str> {
        match &self.change {
            StateChange::Retry { errors, .. } | StateChange::Dead { errors, .. } => {
                errors.as_deref()
            }
            _ => None,
        }
    }
}

/// The most `LastError` text a stamp writes. MariaDB's `TEXT` holds 65,535 bytes, and a
/// value that does not fit fails the whole set-state statement, so every row stamped with
/// it; a handler's 200 KB failure message is cut here instead.
pub const MAX_LAST_ERROR_BYTES: usize = 16 * 1024;

pub(crate) use crate::redact::bounded;

/// Every column of a version-2 (and 3) row, in table order: what moves between the
/// commands table and its history.
pub(crate) const COLUMNS: [&str; 20] = [
    "Id",
    "Type",
    "Payload",
    "CreatedAt",
    "RunAt",
    "Attempts",
    "LockToken",
    "LockedUntil",
    "ProcessedAt",
    "DeadLetteredAt",
    "LastError",
    "UserId",
    "Roles",
    "TenantId",
    "CorrelationId",
    "Queue",
    "Priority",
    "UniqueKey",
    "TraceParent",
    "Snoozes",
];

/// The columns schema version 4 adds to the table and its history, after [`COLUMNS`].
pub(crate) const COLUMNS_V4: [&str; 3] = ["ConcurrencyKey", "OrderKey", "Errors"];

/// Every column of a row of a table at schema `version` (2 or later), in table order:
/// [`COLUMNS`], then [`COLUMNS_V4`] from version 4 on.
pub(crate) fn columns_of(version: u32) -> impl Iterator<Item = &'static str> {
    let v4: &[&str] = if version >= 4 { &COLUMNS_V4 } else { &[] };
    COLUMNS.iter().chain(v4).copied()
}

/// The commands table `t` and its history `h` as one relation to select `FROM`
/// (`UNION ALL` of [`columns_of`] `version`, aliased `icq_all`), for reads that may meet
/// completed rows.
pub(crate) fn with_history(engine: Engine, t: &str, h: &str, version: u32) -> String {
    let columns = column_list(engine, "", version);
    format!("(SELECT {columns} FROM {t} UNION ALL SELECT {columns} FROM {h}) AS icq_all")
}

/// [`columns_of`] `version` quoted for `engine`, comma-separated, each after `prefix`
/// (`deleted.`).
pub(crate) fn column_list(engine: Engine, prefix: &str, version: u32) -> String {
    columns_of(version)
        .map(|c| format!("{prefix}{}", engine.quote_ident(c)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The assignments of an upsert into history that keeps the newest completion of an id
/// (`"Type" = EXCLUDED."Type", …`, PostgreSQL and SQLite): an id the table held again after
/// its first completion moved (scheduled anew with the same id) completes once more.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn history_upsert(engine: Engine, version: u32) -> String {
    columns_of(version)
        .skip(1)
        .map(|c| {
            let c = engine.quote_ident(c);
            format!("{c} = excluded.{c}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Pairs decoded claimed rows with the claim's lease token. A row whose id could not be
/// read (`Err`) cannot be stamped: it is logged and left to its lease.
pub(crate) fn leased_rows(
    table: &TableName,
    token: LeaseToken,
    decoded: impl Iterator<Item = (std::result::Result<CommandRow, sqlx::Error>, usize)>,
) -> Vec<ClaimedRow> {
    decoded
        .filter_map(|(row, payload_bytes)| match row {
            Ok(row) => Some(ClaimedRow {
                payload_bytes,
                lease: Lease {
                    id: row.id.clone(),
                    token,
                },
                row,
                not_due_for: None,
            }),
            Err(err) => {
                tracing::error!(table = %table, error = %err, "a claimed row has no readable id; its lease will expire");
                None
            }
        })
        .collect()
}

/// One batch of the retention sweep.
#[derive(Debug, Clone, Copy)]
pub struct SweepParams {
    /// Completed rows older than this (by `ProcessedAt`) are deleted.
    pub older_than: Duration,
    /// At most this many in this batch.
    pub limit: u32,
}

/// Which leases at the head of the queue belong to other processors.
#[derive(Debug, Clone, Copy)]
pub struct LeaseOthersAtHeadParams {
    /// How many due rows, in claim order, to look at.
    pub window: u32,
    /// This processor's tokens all lie in `low..=high` ([`LeaseToken::owned_by`]).
    pub low: LeaseToken,
    /// See `low`.
    pub high: LeaseToken,
}

/// Which leases to check (the processor's running commands), to learn of the ones lost:
/// an operator cancelled the row (`icq cancel`), or another claim took it over.
#[derive(Debug, Clone)]
pub struct LeaseCheckManyParams {
    /// The leases (id and token) this processor believes it holds.
    pub leases: Vec<Lease>,
}

/// Counts used to decide whether a processor is idle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    /// Pending rows with `RunAt <= now` and no live lease.
    pub due: u64,
    /// Pending rows with a live lease.
    pub running: u64,
}

/// A source's connection lifecycle, apart from its queries: what it is connected to,
/// creating and dropping its table, listening for inserts, closing.
#[async_trait]
pub trait Lifecycle: Send + Sync + 'static {
    /// The engine this driver speaks.
    fn engine(&self) -> Engine;

    /// The table it works on.
    fn table(&self) -> &TableName;

    /// Whether the commands table exists.
    async fn table_exists(&self) -> Result<bool>;

    /// Runs a DDL script (the embedded default creating its table on first use).
    async fn schema_apply(&self, ddl: &str) -> Result<()>;

    /// The schema version of the table: 1 (the original table), 2 (queues, priorities,
    /// unique keys, trace context) or 3 (completed rows move to the history table). Looked
    /// up once (by whether the `Queue` column exists, then the history table) and
    /// remembered; a table that does not exist yet counts as the version icq
    /// would create, and is looked up again next time.
    async fn schema_version(&self) -> Result<u32>;

    /// Forgets the remembered schema version, so the next [`Backend::schema_version`]
    /// looks it up again (another process is changing the table).
    fn forget_schema_version(&self);

    /// Starts listening for inserts committed by any client, signalling `notify` on each,
    /// and for operators cancelling running commands (`icq cancel`), signalling
    /// `cancelled` on each (the processor then checks its leases at once). Returns `false`
    /// where the engine has no such mechanism (the poll and the lease check cover it).
    async fn listen(
        &self,
        notify: Arc<Notify>,
        cancelled: Arc<Notify>,
        queues_changed: Arc<Notify>,
    ) -> Result<bool>;

    /// Closes the connection pool.
    async fn close(&self);

    /// Whether the driver may keep the processor's connections between its statements
    /// (`true` while a processor runs on it; `false` hands every kept connection back to
    /// the pool). Only SQLite keeps any (`engine::sqlite::warm`).
    fn keep_work_connections(&self, _keep: bool) {}

    /// How long one statement may wait for a lock inside the client before it fails on
    /// its own (SQLite's busy timeout), or `None` where waits happen on a server. A call
    /// is never abandoned sooner: abandoning a statement that waits for a local lock frees
    /// nothing (it keeps waiting, and may still run), and its retry queues behind it.
    fn local_lock_wait(&self) -> Option<Duration> {
        None
    }

    /// A call got no answer within the processor's deadline and was abandoned. A driver
    /// that follows a failover takes it as a sign of a lost server: a pool that cannot
    /// connect retries inside the call, so no error of its own ever reaches the driver.
    fn answer_lost(&self) {}

    /// Drops the table and everything its migration created with it by running `down`
    /// (the down script the schema renders), if it exists.
    async fn table_drop(&self, down: &str) -> Result<()>;
}

/// The queue operations of one source's table.
#[async_trait]
pub trait QueueOps: Send + Sync + 'static {
    /// How many claims one processor runs at once on this engine. More claims in flight
    /// keep more backends working on a backlog; where concurrent `SKIP LOCKED` claims
    /// contend (InnoDB), fewer do better. See [`MAX_CLAIMS_IN_FLIGHT`].
    fn claims_in_flight(&self) -> usize {
        MAX_CLAIMS_IN_FLIGHT
    }

    /// Inserts one command on its own (autocommit) and returns its id; with a unique key
    /// whose pending row exists, inserts nothing and returns that row's id
    /// (`existing: true`). On a version-1 table a command asking for a queue, a priority
    /// or a unique key is refused ([`crate::Error::needs_schema_v2`]).
    async fn command_insert(&self, params: &CommandInsertParams<'_>) -> Result<Scheduled>;

    /// Inserts many commands in bulk in one transaction (`COPY` on PostgreSQL), each
    /// with a unique key as [`QueueOps::command_insert`] does: a key already pending, or
    /// repeated within the batch, returns the one row's id for each.
    async fn command_insert_many(
        &self,
        params: &CommandInsertManyParams<'_>,
    ) -> Result<Vec<Scheduled>>;

    /// Claims up to `limit` due rows in one statement under `token`; increments
    /// `Attempts` on each (saturating, so a hostile value cannot fail the statement).
    /// Each row is decoded on its own: one that cannot be decoded comes back with
    /// defects instead of failing the claim.
    async fn command_claim(&self, params: &ClaimParams) -> Result<Vec<ClaimedRow>>;

    /// Stamps `changes` (as [`QueueOps::command_set_state_many`]) and claims (as
    /// [`QueueOps::command_claim`]) in one round trip and one commit: one statement on
    /// PostgreSQL, one transaction elsewhere. Returns how many rows were stamped and the
    /// rows claimed. The stamped rows are leased, so the claim never takes them back.
    async fn command_set_state_and_claim(
        &self,
        params: &CommandSetStateAndClaimParams<'_>,
    ) -> Result<(u64, Vec<ClaimedRow>)>;

    /// Stamps `changes`, then claims from one queue no more than its fleet-wide limits
    /// allow, in one transaction serialised with every other limited claim of the queue
    /// (see [`limits`]). On a table older than version 4 it is refused, naming the upgrade.
    async fn command_claim_limited(&self, params: &LimitedClaimParams<'_>) -> Result<LimitedClaim>;

    /// Reads one row by id (exactly as stored).
    async fn command_get(&self, params: &CommandGetParams<'_>) -> Result<Option<CommandRow>>;

    /// Stamps every outcome kind in one statement, each guarded by its lease token;
    /// returns how many rows were stamped (stale leases are skipped).
    async fn command_set_state_many(&self, params: &CommandSetStateManyParams<'_>) -> Result<u64>;

    /// Extends the leases still held to `now + lease`, guarded by each token; returns
    /// the leases that were extended (the others were lost to another claim).
    async fn lease_extend_many(&self, params: &LeaseExtendManyParams) -> Result<Vec<Lease>>;

    /// Deletes up to `limit` completed rows older than `older_than`; returns how many,
    /// or `None` when another replica holds the sweep lock (PostgreSQL advisory lock,
    /// MySQL `GET_LOCK`) and this one should skip the round. On a version-3 table the
    /// rows deleted are the history's, and the batch also moves up to `limit` completed
    /// rows found in the table itself (an older icq's or another program's) to history,
    /// skipping rows other statements hold; the count is of both.
    async fn completed_delete_batch(&self, params: &SweepParams) -> Result<Option<u64>>;

    /// Reclaims the dead row versions the commands table's claims and moves leave, when
    /// there are more than `dead_rows` of them; returns how many there were, or `None`
    /// when nothing was needed. The server's autovacuum does the same, when it runs,
    /// at most once a naptime; an engine that purges on its own needs nothing.
    async fn table_tidy(&self, _dead_rows: u64) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Of `leases`, the ones still held (the row is pending and its `LockToken` is still
    /// the lease's token); the others were lost: cancelled by an operator or claimed by
    /// another processor. A read, cheap enough to run every second or two.
    async fn lease_check_many(&self, params: &LeaseCheckManyParams) -> Result<Vec<Lease>>;

    /// How many rows are due and running right now. The idle check needs only whether
    /// there are any, so an engine may count only the first rows in claim order (at least
    /// 1,000), where a full count would scan the table.
    async fn activity(&self) -> Result<Activity>;

    /// [`QueueOps::activity`] of the rows of `queues` only (`None`: every queue, as
    /// `activity`). A worker serving some queues is idle when those are; rows with a NULL
    /// `Queue` (which no queue filter matches) count in every call, so the processor
    /// does not idle while they wait to be settled. On a version-1 table, which has no
    /// queues, `Some` is refused like a claim.
    async fn activity_in(&self, queues: Option<&[String]>) -> Result<Activity> {
        let _ = queues;
        self.activity().await
    }

    /// [`QueueOps::activity`] leaving out the due rows of queues paused in
    /// `<table>Queues` (schema version 4; `activity` on older tables).
    async fn activity_unpaused(&self) -> Result<Activity> {
        self.activity().await
    }

    /// How many of the first `window` due rows, in claim order, hold a live lease of
    /// another processor: the rows every claim of this one steps over while other
    /// replicas share the table. Cheap (an index range of `window` rows).
    async fn lease_others_at_head(&self, params: &LeaseOthersAtHeadParams) -> Result<u64>;
}

/// What only `icq bench` asks of a driver, kept out of the queue path's [`QueueOps`].
#[async_trait]
pub trait BenchOps: Send + Sync + 'static {
    /// Inserts `rows` completed rows (`ProcessedAt` = now, type `bench.retained`) in a
    /// few set-based statements, for `icq bench`'s claim measurement with a large
    /// retained history.
    async fn bench_fill_completed(&self, params: &BenchFillCompletedParams) -> Result<()>;
}

/// A driver's remembered [`Lifecycle::schema_version`] (0 until looked up). One look-up
/// at a time: a processor's first claim, its lease checks and its sweep all ask at start,
/// and each concurrent look-up took a connection of its own (two extra logins per
/// PostgreSQL replica).
///
/// A version below the current one is looked up again every [`RECHECK_OLD_VERSION`]
/// (a catalogue query): a table upgraded while workers run is noticed by them, which
/// switch to the new claim (its index and its order) without a restart. Meanwhile, and
/// when the new look-up fails, the version already known is used.
#[derive(Debug, Default)]
pub(crate) struct SchemaVersionCache {
    known: std::sync::atomic::AtomicU32,
    looking: tokio::sync::Mutex<()>,
    /// When an old version was last looked up.
    looked_at: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How often a driver that found an old table version looks it up again.
pub(crate) const RECHECK_OLD_VERSION: std::time::Duration = std::time::Duration::from_secs(5);

/// The schema version of a table that exists, from what its look-up found: the `Queue`
/// column (version 2) and the history table (version 3, which needs version 2's columns).
pub(crate) fn version_of(has_queue: bool, has_history: bool, has_order_key: bool) -> u32 {
    match (has_queue, has_history, has_order_key) {
        (true, true, true) => 4,
        (true, true, false) => 3,
        (true, false, _) => 2,
        (false, _, _) => 1,
    }
}

impl SchemaVersionCache {
    /// The remembered version, or else `look_up()`'s answer: `Some(version)` for an
    /// existing table (remembered), `None` for a missing one (not remembered).
    pub(crate) async fn get<F>(&self, look_up: F) -> Result<u32>
    where
        F: std::future::Future<Output = Result<Option<u32>>>,
    {
        use std::sync::atomic::Ordering;
        let known = self.known.load(Ordering::Acquire);
        if known >= crate::ident::SCHEMA_VERSION {
            return Ok(known);
        }
        if known != 0 {
            if !self.recheck_due() {
                return Ok(known);
            }
            // One looks again; the others go on with what is known.
            let Ok(_one_at_a_time) = self.looking.try_lock() else {
                return Ok(known);
            };
            if !self.recheck_due() {
                return Ok(self.known.load(Ordering::Acquire));
            }
            self.looked_now();
            return Ok(match look_up.await {
                Ok(Some(version)) => {
                    if version != known {
                        tracing::info!(
                            version,
                            "the commands table's schema version changed; using it from now on"
                        );
                    }
                    self.known.store(version, Ordering::Release);
                    version
                }
                Ok(None) | Err(_) => known,
            });
        }
        let _one_at_a_time = self.looking.lock().await;
        let known = self.known.load(Ordering::Acquire);
        if known != 0 {
            return Ok(known);
        }
        match look_up.await? {
            Some(version) => {
                self.looked_now();
                self.known.store(version, Ordering::Release);
                Ok(version)
            }
            None => Ok(crate::ident::SCHEMA_VERSION),
        }
    }

    fn recheck_due(&self) -> bool {
        self.looked_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none_or(|at| at.elapsed() >= RECHECK_OLD_VERSION)
    }

    fn looked_now(&self) {
        *self
            .looked_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(std::time::Instant::now());
    }

    /// Forgets the remembered version (after a DDL script changed the table).
    pub(crate) fn forget(&self) {
        self.known.store(0, std::sync::atomic::Ordering::Release);
    }
}

/// Which queues a claim (or a count) takes: the statement differs for each (one queue
/// is a seek in the queue poll index, in claim order; several are `= ANY` / `IN`).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum QueueFilter {
    /// Every queue.
    All,
    /// One named queue.
    One,
    /// Several named queues (or none).
    Many,
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl QueueFilter {
    pub(crate) fn of(queues: Option<&[String]>) -> QueueFilter {
        match queues {
            None => QueueFilter::All,
            Some([_]) => QueueFilter::One,
            Some(_) => QueueFilter::Many,
        }
    }
}

/// Refuses a queue filter on a version-1 table, which has no queues.
pub(crate) fn check_queues(
    version: u32,
    table: &TableName,
    queues: Option<&[String]>,
) -> Result<()> {
    if version < 2 && queues.is_some() {
        return Err(crate::Error::needs_schema_v2(table, "claiming by queue"));
    }
    Ok(())
}

/// How often, at most, a claim on a version-2 table also looks for pending rows no
/// claim in priority order would settle: a NULL `RunAt` (never due) or a NULL `Queue`
/// (no queue filter matches it), which another program's relaxed columns allow. On a
/// version-2 table that look is not a seek (`RunAt` is not the poll index's first
/// column), so it is not made with every claim; such rows settle within this period.
pub(crate) const UNUSABLE_EVERY: Duration = Duration::from_secs(2);

/// How many times its own duration a look that walks the head of the poll index waits
/// before it is made again: such a look is cheap while the head is, and grows with every
/// entry a held xmin horizon (or MariaDB's held-back purge) keeps there.
const LOOK_COST_SHARE: u32 = 50;

/// How many times its usual interval a paced look waits at most: what only such a look
/// finds (a lapsed lease behind the cursor) waits for it, so a look slowed by a stall
/// (lock waits, a loaded server) must not put off the next for many minutes. Past the
/// cap a costly look takes more than a fiftieth of the time (a look of a second: a
/// thirtieth), which only a head grown over a very long hold costs.
const PACED_AT_MOST: u32 = 60;

/// The interval between two looks at the head of the poll index: `every`, or longer when
/// the last look took `cost` (so such looks take at most a fiftieth of the time), but
/// never more than sixty times `every`.
pub(crate) fn paced(every: Duration, cost: Duration) -> Duration {
    every
        .max(cost.saturating_mul(LOOK_COST_SHARE))
        .min(every.saturating_mul(PACED_AT_MOST))
}

/// When a driver's claims last looked for unusable rows (see [`UNUSABLE_EVERY`]), and
/// how long the claim that looked took ([`paced`]).
#[derive(Debug, Default)]
pub(crate) struct UnusableGate(std::sync::Mutex<(Option<std::time::Instant>, Duration)>);

impl UnusableGate {
    /// Whether this claim should look (and, if so, the look is counted as made now).
    pub(crate) fn due(&self) -> bool {
        let mut state = self.lock();
        let (at, cost) = *state;
        if at.is_some_and(|at| at.elapsed() < paced(UNUSABLE_EVERY, cost)) {
            return false;
        }
        state.0 = Some(std::time::Instant::now());
        true
    }

    /// Records how long a claim that looked took.
    pub(crate) fn took(&self, cost: Duration) {
        self.lock().1 = cost;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Option<std::time::Instant>, Duration)> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Claim statements rendered on first use, by their shape (the key).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
#[derive(Debug)]
pub(crate) struct SqlCache<K>(std::sync::Mutex<std::collections::HashMap<K, Arc<str>>>);

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<K> Default for SqlCache<K> {
    fn default() -> Self {
        SqlCache(std::sync::Mutex::new(std::collections::HashMap::new()))
    }
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
impl<K: std::hash::Hash + Eq + Copy> SqlCache<K> {
    /// The statement of `key`, rendered by `render` the first time.
    pub(crate) fn get(&self, key: K, render: impl FnOnce(K) -> String) -> Arc<str> {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        map.entry(key).or_insert_with(|| render(key).into()).clone()
    }
}

/// How many times an insert with a unique key tries again when the pending row holding
/// the key settled between the insert that met it and the read of its id.
pub(crate) const UNIQUE_KEY_TRIES: usize = 20;

/// The error when the pending row holding a unique key keeps settling (or cannot be
/// seen) between the insert and the read.
pub(crate) fn unique_key_unsettled(table: &TableName, key: &str) -> crate::Error {
    crate::Error::Conflict(format!(
        "scheduling into {table}: a pending row holds unique key `{key}`, but its id could not \
         be read (it kept settling, or the transaction's snapshot predates it: schedule with \
         a unique key in a READ COMMITTED transaction); nothing was scheduled"
    ))
}

/// Runs a DDL script (several statements) on `executor`: creating or dropping a table.
pub(crate) async fn run_script<'e, E>(executor: E, ddl: String, context: String) -> Result<()>
where
    E: sqlx::Executor<'e>,
{
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(executor)
        .await
        .map_err(crate::error::Error::db(context))?;
    Ok(())
}

/// Everything one source's driver offers: its lifecycle, queue operations, operator
/// queries, its health reads, its queue pauses, its schedules' bookkeeping and `icq
/// bench`'s helper.
pub trait Backend:
    Lifecycle + QueueOps + AdminOps + HealthOps + ControlOps + ScheduleOps + BenchOps
{
}

impl<T: Lifecycle + QueueOps + AdminOps + HealthOps + ControlOps + ScheduleOps + BenchOps> Backend
    for T
{
}

/// The engine half of the embedding API's sealed traits: [`crate::QueueDatabase`] and
/// [`crate::Enqueue`] extend these, and each engine's folder implements them for its
/// sqlx types (built with its feature), so no one else can.
pub(crate) mod sealed {
    use std::future::Future;
    use std::sync::Arc;

    use super::Backend;
    use crate::error::Result;
    use crate::ident::TableName;

    /// A connection type `Enqueue` is implemented for (each engine's, in its
    /// folder under `src/engine/`, built with its feature).
    #[diagnostic::on_unimplemented(
        message = "icq cannot schedule through `{Self}`",
        note = "pass a connection, or an open transaction as `&mut *tx` (a `&mut Transaction` itself is not a connection)",
        note = "if it is one, enable icq-queue's Cargo feature for its engine: `postgres`, `sqlite` or `mysql` (MySQL and MariaDB)"
    )]
    pub trait Connection {}

    /// A sqlx database whose pool a queue can be made from (implemented in each engine's
    /// folder, built with its feature).
    #[diagnostic::on_unimplemented(
        message = "icq has no driver for `{Self}` in this build",
        note = "enable icq-queue's Cargo feature for the engine: `postgres`, `sqlite` or `mysql` (MySQL and MariaDB)"
    )]
    pub trait Database: sqlx::Database {
        /// The driver for `table` on the application's `pool`.
        fn driver(
            pool: &sqlx::Pool<Self>,
            table: &TableName,
        ) -> impl Future<Output = Result<Arc<dyn Backend>>> + Send;
    }
}

/// A sqlx database icq runs on: [`sqlx::Postgres`], [`sqlx::Sqlite`] or [`sqlx::MySql`]
/// (MySQL and MariaDB). [`crate::Queue::from_pool`] and [`crate::schema::apply`] take a pool of
/// any of them whose Cargo feature (`postgres`, `sqlite`, `mysql`) the build enables.
/// Sealed: implemented by icq only.
#[diagnostic::on_unimplemented(
    message = "icq has no driver for `{Self}` in this build",
    note = "enable icq-queue's Cargo feature for the engine: `postgres`, `sqlite` or `mysql` (MySQL and MariaDB)"
)]
pub trait QueueDatabase: sealed::Database {}

impl<DB: sealed::Database> QueueDatabase for DB {}

/// Connection options for a source's pool ([`crate::Queue::connect`]).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use icq::ConnectOptions;
///
/// let options = ConnectOptions::default()
///     .with_max_connections(4)
///     .with_acquire_timeout(Duration::from_secs(2));
/// assert_eq!(ConnectOptions::default().max_connections, 10);
/// assert_eq!(options.max_connections, 4);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// Most pooled connections.
    pub max_connections: u32,
    /// How long to wait for a connection before failing.
    pub acquire_timeout: Duration,
    /// The pooler in front of a PostgreSQL server (the source's `pooler` setting).
    pub pooler: crate::settings::Pooler,
    /// Create the table when it is missing, and upgrade a SQLite table of an older schema
    /// version to the current one, instead of failing: for a database icq owns (the embedded default), never
    /// for an application's database, whose table comes from its migrations.
    pub create_table: bool,
}

impl ConnectOptions {
    /// These options with [`ConnectOptions::max_connections`] set. See
    /// [`ConnectOptions`]'s example.
    pub fn with_max_connections(mut self, max_connections: u32) -> ConnectOptions {
        self.max_connections = max_connections;
        self
    }

    /// These options with [`ConnectOptions::acquire_timeout`] set. See
    /// [`ConnectOptions`]'s example.
    pub fn with_acquire_timeout(mut self, acquire_timeout: Duration) -> ConnectOptions {
        self.acquire_timeout = acquire_timeout;
        self
    }

    /// These options with [`ConnectOptions::pooler`] set.
    pub fn with_pooler(mut self, pooler: crate::settings::Pooler) -> ConnectOptions {
        self.pooler = pooler;
        self
    }

    /// These options with [`ConnectOptions::create_table`] set.
    pub fn creating_table(mut self, create_table: bool) -> ConnectOptions {
        self.create_table = create_table;
        self
    }

    /// Options sized for a processor with `settings`: one connection per execution slot
    /// is never needed (stamps are batched), but up to four claims, two stamps, lease
    /// renewals and the sweep run side by side; and the source's pooler.
    pub fn for_settings(settings: &crate::settings::Settings) -> ConnectOptions {
        ConnectOptions {
            max_connections: (settings.concurrency / 2).clamp(4, 32) + MAX_CLAIMS_IN_FLIGHT as u32,
            pooler: settings.pooler,
            ..ConnectOptions::default()
        }
    }

    /// The pool options every driver starts from: these limits, no ping before each
    /// acquire (a broken connection fails its statement and is replaced; pinging first
    /// would double the round trips of the hot path), and [`release_check`] on release.
    pub(crate) fn pool<DB: sqlx::Database>(&self) -> sqlx::pool::PoolOptions<DB> {
        sqlx::pool::PoolOptions::<DB>::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false)
            .after_release(|conn, _| {
                // A large row (a payload of megabytes) grows the connection's buffers to
                // its size: give that memory back instead of keeping it per connection.
                sqlx::Connection::shrink_buffers(conn);
                Box::pin(release_check::<DB::Connection>(conn))
            })
    }
}

/// How long a connection coming back to its pool gets to answer a ping.
const RELEASE_PING: Duration = Duration::from_secs(1);

/// The pools' `after_release` hook: `Ok(true)` keeps the connection. A released
/// connection must answer a ping within [`RELEASE_PING`] or is closed at once (`Err`: sqlx
/// drops it without the goodbye a dead socket would never take). sqlx pings every released
/// connection itself, but without a bound: one whose call was abandoned at its deadline
/// (a stalled proxy or NAT, a half-open socket) would wait there forever, holding its pool
/// slot, or go back to the pool half-read.
async fn release_check<C: sqlx::Connection>(
    conn: &mut C,
) -> std::result::Result<bool, sqlx::Error> {
    match tokio::time::timeout(RELEASE_PING, conn.ping()).await {
        Ok(Ok(())) => Ok(true),
        // The server answered with the lost race of a transaction abandoned on this
        // connection (SQLSTATE 40001: a deadlock, or a Galera node aborting it for a
        // replicated one): closed quietly, as a routine outcome.
        Ok(Err(sqlx::Error::Database(db))) if db.code().as_deref() == Some("40001") => Ok(false),
        Ok(Err(err)) => Err(err),
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "a released connection did not answer a ping: closed",
        ))),
    }
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            pooler: crate::settings::Pooler::Session,
            create_table: false,
        }
    }
}

/// Opens a driver for `url` (engine from the scheme) on `table`. A server that has not
/// answered within [`probe::PROBE_AFTER`] is probed meanwhile: a refused port or
/// a host that does not resolve fails at once with [`crate::Error::Connect`] naming the
/// cause, instead of after the pool's whole `acquire_timeout`.
pub async fn connect(
    url: &str,
    table: &TableName,
    options: &ConnectOptions,
) -> Result<Arc<dyn Backend>> {
    let url = &url::for_driver(url);
    probe::watch_connect(url, connect_driver(url, table, options)).await
}

/// Upgrades the table at `url` from an older schema version by running `upgrade(version)`
/// (the schema's upgrade script from that version), where icq owns the database and finds
/// an older table: the embedded SQLite default. Other engines' tables are upgraded by their
/// migrations, so this does nothing for them. Returns whether it upgraded.
pub(crate) async fn upgrade_owned_table(
    url: &str,
    table: &TableName,
    upgrade: &(dyn Fn(u32) -> String + Sync),
) -> Result<bool> {
    match Engine::from_url(url)? {
        #[cfg(feature = "sqlite")]
        Engine::Sqlite => sqlite::upgrade_embedded(&url::for_driver(url), table, upgrade).await,
        _ => {
            let _ = (table, upgrade);
            Ok(false)
        }
    }
}

/// The driver for `url`'s engine, connected (unwatched: see [`connect`]).
async fn connect_driver(
    url: &str,
    table: &TableName,
    options: &ConnectOptions,
) -> Result<Arc<dyn Backend>> {
    // Each engine's arm exists only in a build with its feature; the others fall to the
    // last arm, which names the feature to enable.
    match Engine::from_url(url)? {
        #[cfg(feature = "postgres")]
        Engine::Postgres => Ok(Arc::new(
            postgres::PgDriver::connect(url, table, options).await?,
        )),
        #[cfg(feature = "sqlite")]
        Engine::Sqlite => Ok(Arc::new(
            sqlite::SqliteDriver::connect(url, table, options).await?,
        )),
        #[cfg(feature = "mysql")]
        Engine::Mysql => Ok(Arc::new(
            mysql::MySqlDriver::connect(url, table, options).await?,
        )),
        Engine::SqlServer => Err(crate::Error::Unsupported(
            "SQL Server is supported for migrations only; \
             the processor and operator commands need PostgreSQL, SQLite or MySQL/MariaDB"
                .into(),
        )),
        #[allow(unreachable_patterns, reason = "reached without an engine feature")]
        absent => Err(crate::Error::engine_not_built(absent)),
    }
}

/// Decodes one non-negative count column (`COUNT(*)`/`SUM(…)` cast to a 64-bit integer).
pub(crate) fn decode_count<R>(row: &R, column: &str) -> Result<u64>
where
    R: sqlx::Row,
    i64: sqlx::Type<R::Database> + for<'r> sqlx::Decode<'r, R::Database>,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
{
    let n: i64 = row
        .try_get(column)
        .map_err(crate::Error::db(format!("decoding the {column} count")))?;
    Ok(n.max(0) as u64)
}

/// Decodes the `due` / `running` counts every engine's activity query returns.
pub(crate) fn decode_activity<R>(row: &R) -> Result<Activity>
where
    R: sqlx::Row,
    i64: sqlx::Type<R::Database> + for<'r> sqlx::Decode<'r, R::Database>,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
{
    Ok(Activity {
        due: decode_count(row, "due")?,
        running: decode_count(row, "running")?,
    })
}

/// `?, ?, …` with `n` markers (SQLite and MySQL placeholders for an `IN (…)` list).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Validates every command of a batch before anything is written: the first invalid
/// one fails the whole batch with an error naming its index and id, so the caller can
/// find it among thousands.
pub(crate) fn validate_batch(commands: &[NewCommand]) -> crate::Result<()> {
    for (index, command) in commands.iter().enumerate() {
        command.validate().map_err(|err| match err {
            crate::Error::Invalid { message, source } => crate::Error::Invalid {
                message: format!(
                    "command {index} of the batch (id {}): {message}; nothing was scheduled",
                    command.id
                ),
                source,
            },
            other => other,
        })?;
    }
    Ok(())
}

/// Refuses, on a table below schema version 2, a command that asks for what only version
/// 2 has (a queue, a priority, a unique key): [`crate::Error::NeedsSchemaV2`], before
/// anything is written.
pub(crate) fn refuse_v2_asks<'a>(
    table: &TableName,
    version: u32,
    mut commands: impl Iterator<Item = &'a NewCommand>,
) -> crate::Result<()> {
    if version >= 2 {
        return Ok(());
    }
    match commands.find_map(NewCommand::needs_v2) {
        Some(what) => Err(crate::Error::needs_schema_v2(table, what)),
        None => Ok(()),
    }
}

/// Refuses what `commands` ask of a table of `version` that it does not have:
/// [`refuse_v2_asks`], then [`refuse_v4_asks`].
pub(crate) fn refuse_newer_asks<'a>(
    table: &TableName,
    version: u32,
    commands: impl Iterator<Item = &'a NewCommand> + Clone,
) -> crate::Result<()> {
    refuse_v2_asks(table, version, commands.clone())?;
    refuse_v4_asks(table, version, commands)
}

/// The schema version a batch of `commands` is written for: the table's (`version`, only
/// awaited when needed) when any command sets a column version 1 lacks, else 1 (a
/// version-1 row fits every table).
pub(crate) async fn batch_version(
    commands: &[NewCommand],
    version: impl std::future::Future<Output = crate::Result<u32>>,
) -> crate::Result<u32> {
    if commands.iter().any(NewCommand::uses_v2_columns) {
        version.await
    } else {
        Ok(1)
    }
}

/// Refuses, on a table below schema version 4, a command that sets an order or a
/// concurrency key: [`crate::Error::NeedsSchemaV4`], before anything is written.
pub(crate) fn refuse_v4_asks<'a>(
    table: &TableName,
    version: u32,
    mut commands: impl Iterator<Item = &'a NewCommand>,
) -> crate::Result<()> {
    if version >= 4 {
        return Ok(());
    }
    match commands.find_map(NewCommand::needs_v4) {
        Some(what) => Err(crate::Error::needs_schema_v4(table, version, what)),
        None => Ok(()),
    }
}

/// The driver conformance suite (`tests/driver/`): every driver through this seam, on
/// every engine. Compiled into the library's unit tests so it needs no public driver, and
/// only under the `driver-suite` feature, so that `cargo test --lib` needs no server:
/// `cargo test --lib --features driver-suite engine::conformance`.
#[cfg(all(test, feature = "driver-suite"))]
#[path = "../../tests/driver/mod.rs"]
mod conformance;

#[cfg(test)]
mod tests {
    use super::{Duration, UNUSABLE_EVERY, UnusableGate, bounded, paced};

    /// A cheap look keeps its interval; a costly one waits fifty times what it took, up to
    /// sixty intervals.
    #[test]
    fn looks_at_the_head_are_paced_by_their_cost() {
        let every = Duration::from_secs(1);
        assert_eq!(paced(every, Duration::from_millis(1)), every);
        assert_eq!(
            paced(every, Duration::from_millis(60)),
            Duration::from_secs(3)
        );
        assert_eq!(
            paced(every, Duration::from_secs(5)),
            Duration::from_secs(60),
            "a look slowed by a stall does not put off the next for many minutes"
        );
        let gate = UnusableGate::default();
        assert!(gate.due(), "the first claim looks");
        assert!(!gate.due(), "not again at once");
        gate.lock().0 = Some(std::time::Instant::now() - UNUSABLE_EVERY);
        assert!(gate.due(), "again after the interval");
        gate.took(Duration::from_millis(100));
        gate.lock().0 = Some(std::time::Instant::now() - UNUSABLE_EVERY);
        assert!(!gate.due(), "a look that took 100 ms waits 5 s");
        gate.lock().0 = Some(std::time::Instant::now() - Duration::from_secs(5));
        assert!(gate.due());
    }

    #[test]
    fn bounded_keeps_short_text_and_cuts_long_text_on_a_char_boundary() {
        assert_eq!(bounded("short", 100), "short");
        let long = "é".repeat(10_000);
        let cut = bounded(&long, 1001);
        assert!(cut.len() <= 1001, "{}", cut.len());
        assert!(cut.starts_with("éé"));
        assert!(cut.ends_with("[cut: 20000 bytes in all]"), "{cut}");
    }
}
