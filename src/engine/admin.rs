//! Operator queries (counts, dead letters, requeue, purge) as a trait each engine driver
//! implements next to its queue operations, in `postgres/admin.rs`, `sqlite/admin.rs` and
//! `mysql/admin.rs`.
//!
//! The bulk operations are shaped so that no caller can hold a long transaction: each
//! `*_batch` method touches at most `limit` rows in one short statement (or one short
//! transaction where the engine needs two statements) and the caller loops. Batches are
//! bounded by a fixed cutoff instant taken from [`AdminOps::clock_now`] when the operation
//! starts, so rows that die or complete while it runs are not chased forever.
//!
//! Every state test follows the product contract and [`crate::State`]: a row with
//! `ProcessedAt` set is completed; otherwise a row with `DeadLetteredAt` set is dead;
//! otherwise it is pending — running while its lease is live, else due when
//! `RunAt <= now` or `RunAt` is NULL (no time makes such a row due, so the claim takes it
//! at once to dead-letter it, and the counts show it where the claim finds it), else
//! scheduled.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::command::{CommandId, CommandRow};
use crate::error::Result;

/// What [`AdminOps::state_count`] groups by, and which rows it counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateCountParams {
    /// One result per command type (ordered by type) instead of one for the whole table.
    pub by_type: bool,
    /// One result per queue (ordered by queue; before the type when both are asked). A
    /// version-1 table has one queue, `default`.
    pub by_queue: bool,
    /// Only rows of this queue (version-2 tables only: the caller refuses it on version 1).
    pub queue: Option<String>,
}

/// How many rows are in each state (for the whole table, or for one type).
///
/// See [`crate::admin::PendingCount`]'s example.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StateCount {
    /// The queue, when counting by queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// The command type, when counting by type.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_name: Option<String>,
    /// Pending, no live lease, `RunAt <= now` or NULL.
    pub due: u64,
    /// Pending, no live lease, `RunAt > now`.
    pub scheduled: u64,
    /// Pending with a live lease.
    pub running: u64,
    /// Dead-lettered.
    pub dead: u64,
    /// Completed.
    pub completed: u64,
}

impl StateCount {
    /// The rows counted in one listing `state` (`pending` is due, scheduled and running).
    pub fn in_state(&self, state: ListState) -> u64 {
        match state {
            ListState::Pending => self.due + self.scheduled + self.running,
            ListState::Due => self.due,
            ListState::Scheduled => self.scheduled,
            ListState::Running => self.running,
            ListState::Dead => self.dead,
            ListState::Completed => self.completed,
        }
    }
}

/// Which dead letters [`AdminOps::dead_letter_list`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterListParams {
    /// Only this command type.
    pub type_name: Option<String>,
    /// Only this queue (version-2 tables only).
    pub queue: Option<String>,
    /// At most this many rows, newest (by `DeadLetteredAt`) first.
    pub limit: u32,
}

/// A dead letter as listed: everything but the payload and the captured context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterSummary {
    /// `Id`.
    pub id: CommandId,
    /// `Type`.
    #[serde(rename = "type")]
    pub type_name: String,
    /// `Queue` (`default` on a version-1 table).
    pub queue: String,
    /// `Priority` (0 on a version-1 table).
    pub priority: i16,
    /// `Attempts`.
    pub attempts: i32,
    /// `DeadLetteredAt`.
    pub dead_lettered_at: DateTime<Utc>,
    /// `LastError`.
    pub last_error: Option<String>,
}

impl From<CommandRow> for DeadLetterSummary {
    fn from(row: CommandRow) -> DeadLetterSummary {
        let last_error = match row.defect_summary() {
            None => row.last_error,
            Some(defects) => Some(match row.last_error {
                Some(error) => format!("{error} ({defects})"),
                None => defects,
            }),
        };
        DeadLetterSummary {
            id: row.id,
            type_name: row.type_name,
            queue: row.queue,
            priority: row.priority,
            attempts: row.attempts,
            dead_lettered_at: row.dead_lettered_at.unwrap_or(DateTime::<Utc>::UNIX_EPOCH),
            last_error,
        }
    }
}

/// A set of dead letters fixed at the start of a bulk operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterFilter {
    /// Only this command type.
    pub type_name: Option<String>,
    /// Only this queue (version-2 tables only).
    pub queue: Option<String>,
    /// Only rows dead-lettered at or before this instant (the operation's start), so a
    /// requeued row that dies again is not picked up a second time.
    pub dead_before: DateTime<Utc>,
}

/// One page of [`AdminOps::dead_letter_page`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterPageParams {
    /// The rows to requeue.
    pub filter: DeadLetterFilter,
    /// At most this many rows in this page.
    pub limit: u32,
}

/// A dead letter a bulk requeue may put back: its id and unique key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterKey {
    /// `Id`, as stored.
    pub id: CommandId,
    /// `UniqueKey` (always `None` on a version-1 table).
    pub unique_key: Option<String>,
}

impl From<(String, Option<String>)> for DeadLetterKey {
    /// A row of the text-id engines' dead-letter page: `Id`, `UniqueKey`.
    fn from((id, unique_key): (String, Option<String>)) -> Self {
        DeadLetterKey {
            id: CommandId::stored(id),
            unique_key,
        }
    }
}

/// The rows of [`AdminOps::command_requeue_dead_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRequeueDeadManyParams {
    /// Ids of dead letters; the ones no longer dead are left alone.
    pub ids: Vec<CommandId>,
}

/// The keys of [`AdminOps::unique_key_holders`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UniqueKeyHoldersParams {
    /// Unique keys (distinct).
    pub keys: Vec<String>,
}

/// The row of [`AdminOps::order_key_holder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderKeyHolderParams {
    /// The row that may wait.
    pub id: CommandId,
}

/// A pending row holding a unique key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UniqueKeyHolder {
    /// The key.
    pub unique_key: String,
    /// The pending row holding it.
    pub id: CommandId,
}

/// What one [`AdminOps::dead_letter_requeue_batch`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequeueBatch {
    /// Dead letters the page held.
    pub selected: u64,
    /// Of those, how many went back to pending.
    pub requeued: u64,
}

/// A bulk requeue's batch in two statements: the page, then the first row of each key
/// (and every row without one) put back by id.
pub(crate) async fn requeue_page<A: AdminOps + ?Sized>(
    admin: &A,
    params: &DeadLetterPageParams,
) -> Result<RequeueBatch> {
    let page = admin.dead_letter_page(params).await?;
    let mut keys = std::collections::HashSet::new();
    let ids: Vec<CommandId> = page
        .iter()
        .filter(|row| {
            row.unique_key
                .as_ref()
                .is_none_or(|key| keys.insert(key.clone()))
        })
        .map(|row| row.id.clone())
        .collect();
    let requeued = if ids.is_empty() {
        0
    } else {
        admin
            .command_requeue_dead_many(&CommandRequeueDeadManyParams { ids })
            .await?
    };
    Ok(RequeueBatch {
        selected: page.len() as u64,
        requeued,
    })
}

/// A dead letter that cannot be put back to pending because a pending row holds its
/// unique key (at most one pending row per key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyConflict {
    /// The dead letter, left dead.
    pub id: CommandId,
    /// Its `UniqueKey`.
    pub unique_key: String,
    /// The pending row holding the key.
    pub held_by: CommandId,
}

impl From<(String, String, String)> for KeyConflict {
    /// A row of the text-id engines' key-conflict read: the dead letter's `Id`, its
    /// `UniqueKey`, the pending row's `Id`.
    fn from((id, unique_key, held_by): (String, String, String)) -> Self {
        KeyConflict {
            id: CommandId::stored(id),
            unique_key,
            held_by: CommandId::stored(held_by),
        }
    }
}

/// The explicit rows of [`AdminOps::command_requeue_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRequeueManyParams {
    /// Distinct ids, all of which must exist and be requeueable.
    pub ids: Vec<CommandId>,
}

/// A finished state a purge deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishedKind {
    /// Completed rows, aged by `ProcessedAt`.
    Completed,
    /// Dead letters, aged by `DeadLetteredAt`.
    DeadLetters,
}

/// Finished rows of one kind at or before a fixed instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedFilter {
    /// Completed rows or dead letters.
    pub kind: FinishedKind,
    /// Only rows finished at or before this instant.
    pub before: DateTime<Utc>,
    /// Only rows of this queue (version-2 tables only).
    pub queue: Option<String>,
    /// Only rows of this command type.
    pub type_name: Option<String>,
}

/// One batch of [`AdminOps::finished_delete_batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedDeleteBatchParams {
    /// The rows to delete.
    pub filter: FinishedFilter,
    /// At most this many rows in this batch.
    pub limit: u32,
}

/// `LastError` of a command an operator cancelled.
pub const CANCELLED: &str = "cancelled by operator";

/// Which rows a listing ([`crate::admin::list`]) returns, and in which order.
///
/// # Examples
///
/// ```
/// use icq::admin::ListState;
///
/// assert!(ListState::Dead.newest_first());
/// assert_eq!(ListState::Due.key_column(), "RunAt");
/// assert_eq!(serde_json::to_value(ListState::Completed).unwrap(), "completed");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum ListState {
    /// Every pending row (due, scheduled and running), in claim order: `Priority`, then
    /// `RunAt`, then `Id` (`RunAt`, `Id` on a version-1 table).
    Pending,
    /// Pending, no live lease, `RunAt <= now`, in claim order like [`ListState::Pending`].
    Due,
    /// Pending, no live lease, `RunAt > now`, in `RunAt` order.
    Scheduled,
    /// Pending with a live lease, in `RunAt` order.
    Running,
    /// Dead letters, newest (`DeadLetteredAt`) first.
    Dead,
    /// Completed rows, newest (`ProcessedAt`) first.
    Completed,
}

impl ListState {
    /// Newest first (finished rows) rather than in queue order.
    pub fn newest_first(self) -> bool {
        matches!(self, ListState::Dead | ListState::Completed)
    }

    /// Listed in the order workers claim due rows, `Priority` first (then `RunAt`, then
    /// `Id`), where the table has priorities (schema version 2): `pending` and `due`.
    /// The other states are listed by [`ListState::key_column`] alone.
    pub fn claim_order(self) -> bool {
        matches!(self, ListState::Pending | ListState::Due)
    }

    /// The column a listing is ordered by: `RunAt`, `DeadLetteredAt` or `ProcessedAt`.
    pub fn key_column(self) -> &'static str {
        match self {
            ListState::Dead => "DeadLetteredAt",
            ListState::Completed => "ProcessedAt",
            _ => "RunAt",
        }
    }
}

/// One page of [`AdminOps::command_list`]: keyset pagination, so every page costs the
/// same however deep it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandListParams {
    /// The rows and their order.
    pub state: ListState,
    /// Only this command type.
    pub type_name: Option<String>,
    /// Only this queue (version-2 tables only).
    pub queue: Option<String>,
    /// At most this many rows.
    pub limit: u32,
    /// Continue after this row (which must exist): the page starts with the row that
    /// follows it in the listing's order.
    pub after: Option<CommandId>,
    /// Only rows whose ordering time is earlier than this.
    pub before: Option<DateTime<Utc>>,
}

/// A listing page for engines with numbered placeholders (`$n` on PostgreSQL, `?n` on
/// SQLite) and double-quoted identifiers: `condition` selects the state's rows, `1` is
/// the limit, then each present filter in bind order (type, queue, before, after). The keyset is
/// `(key, Id)`, or `(Priority, key, Id)` in claim order (`by_priority`: see
/// [`ListState::claim_order`], on a version-2 table); `key <= k` (or `>=`) keeps it an
/// index range.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn numbered_list_sql(
    t: &str,
    params: &CommandListParams,
    condition: String,
    sigil: char,
    by_priority: bool,
) -> String {
    let key = format!(r#""{}""#, params.state.key_column());
    let (dir, cmp) = if params.state.newest_first() {
        ("DESC", "<")
    } else {
        ("ASC", ">")
    };
    let mut next = 1;
    let mut mark = || {
        next += 1;
        format!("{sigil}{next}")
    };
    let mut conditions = vec![condition];
    if params.type_name.is_some() {
        conditions.push(format!(r#""Type" = {}"#, mark()));
    }
    if params.queue.is_some() {
        conditions.push(format!(r#""Queue" = {}"#, mark()));
    }
    if params.before.is_some() {
        conditions.push(format!("{key} < {}", mark()));
    }
    if params.after.is_some() {
        let id = mark();
        let k = format!(r#"(SELECT {key} FROM {t} WHERE "Id" = {id})"#);
        conditions.push(if by_priority {
            // A row value: the index range starts at the cursor, however many rows share
            // its priority.
            let p = format!(r#"(SELECT "Priority" FROM {t} WHERE "Id" = {id})"#);
            format!(r#"("Priority", {key}, "Id") {cmp} ({p}, {k}, {id})"#)
        } else {
            format!(r#"{key} {cmp}= {k} AND ({key} {cmp} {k} OR "Id" {cmp} {id})"#)
        });
    }
    let priority = if by_priority {
        format!(r#""Priority" {dir}, "#)
    } else {
        String::new()
    };
    format!(
        r#"SELECT * FROM {t} WHERE {} ORDER BY {priority}{key} {dir}, "Id" {dir} LIMIT {sigil}1"#,
        conditions.join(" AND ")
    )
}

/// The rows of [`AdminOps::command_cancel_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandCancelManyParams {
    /// Distinct ids.
    pub ids: Vec<CommandId>,
    /// Cancel running rows too (their lease is cleared, so the processor running one
    /// loses it and stops its handler). Without it, running rows are left alone.
    pub running: bool,
}

/// A row [`AdminOps::command_cancel_many`] cancelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelledRow {
    /// Its id, as stored.
    pub id: CommandId,
    /// It held a live lease (a processor was running it) when it was cancelled.
    pub was_running: bool,
}

/// The rows to read, in any state.
#[derive(Debug, Clone, Copy)]
pub struct CommandGetManyParams<'a> {
    /// Their ids; ids that do not exist are absent from the result.
    pub ids: &'a [CommandId],
}

/// The row to read with its payload cut, see [`AdminOps::command_head`].
#[derive(Debug, Clone, Copy)]
pub struct CommandHeadParams<'a> {
    /// The row's id.
    pub id: &'a CommandId,
    /// At most this many characters of the payload's text are read.
    pub max_chars: u32,
}

/// One row whose payload the database cut, see [`AdminOps::command_head`].
#[derive(Debug, Clone, PartialEq)]
pub struct CommandHead {
    /// Every column but the payload, which is left `null`.
    pub row: CommandRow,
    /// The first characters of the payload's JSON text, as the database prints it.
    pub payload_head: String,
    /// The length of the payload's whole JSON text, in bytes.
    pub payload_bytes: u64,
}

/// Operator queries over one source's table.
#[async_trait]
pub trait AdminOps: Send + Sync + 'static {
    /// Why no row of this table can have `id` (`None` when one can): an id of another shape
    /// than the `Id` column holds is a mistake to name, not a row to look for.
    fn id_problem(&self, id: &crate::command::CommandId) -> Option<String> {
        let _ = id;
        None
    }

    /// The database's current time, the reference for every cutoff an operation fixes.
    async fn clock_now(&self) -> Result<DateTime<Utc>>;

    /// Counts rows per state in one aggregate query (per type with `by_type`).
    async fn state_count(&self, params: &StateCountParams) -> Result<Vec<StateCount>>;

    /// Lists dead letters, newest first.
    async fn dead_letter_list(
        &self,
        params: &DeadLetterListParams,
    ) -> Result<Vec<DeadLetterSummary>>;

    /// Reads the row with this id, in any state, with only the first `max_chars`
    /// characters of its payload's text and the whole text's length, both computed by the
    /// database: a payload of megabytes is never sent to show its start.
    async fn command_head(&self, params: &CommandHeadParams<'_>) -> Result<Option<CommandHead>>;

    /// Reads the rows with these ids, in any state; ids that do not exist are absent.
    async fn command_get_many(&self, params: &CommandGetManyParams<'_>) -> Result<Vec<CommandRow>>;

    /// Puts every listed row back to pending now (`RunAt = now`, `Attempts = 0`,
    /// `DeadLetteredAt` and the lease cleared, `LastError` kept), all or nothing, in one
    /// transaction. A row is requeueable when it is not completed and holds no live lease.
    /// When any id is missing or not requeueable nothing changes and 0 is returned.
    async fn command_requeue_many(&self, params: &CommandRequeueManyParams) -> Result<u64>;

    /// One page of rows in a state, in the state's order (see [`ListState`]).
    async fn command_list(&self, params: &CommandListParams) -> Result<Vec<CommandRow>>;

    /// Dead-letters every listed row that is pending (and holds no live lease, unless
    /// `running`), with `LastError` = [`CANCELLED`] and the lease cleared, in one statement
    /// per batch of ids; other rows are left alone. On PostgreSQL, when a running row was
    /// cancelled, the same transaction notifies `icq_cancel_<table name>` so its processor
    /// checks its leases at once. Returns the rows cancelled.
    async fn command_cancel_many(
        &self,
        params: &CommandCancelManyParams,
    ) -> Result<Vec<CancelledRow>>;

    /// The pending rows holding any of these unique keys (none on a version-1 table).
    async fn unique_key_holders(
        &self,
        params: &UniqueKeyHoldersParams,
    ) -> Result<Vec<UniqueKeyHolder>>;

    /// The oldest pending row of the same `OrderKey` scheduled before row `id` (by
    /// `CreatedAt`, then `Id`): the row it waits behind. `None` when it has no order key,
    /// waits behind nothing, is not in the table, or the table is older than version 4.
    async fn order_key_holder(&self, params: &OrderKeyHolderParams) -> Result<Option<CommandId>>;

    /// How many dead letters match `filter`.
    async fn dead_letter_count(&self, filter: &DeadLetterFilter) -> Result<u64>;

    /// Up to `limit` dead letters matching the filter, oldest first, leaving out the ones
    /// whose unique key a pending row holds (they cannot be put back).
    async fn dead_letter_page(&self, params: &DeadLetterPageParams) -> Result<Vec<DeadLetterKey>>;

    /// Requeues (as [`AdminOps::command_requeue_many`] does) the listed rows that are
    /// still dead, in one short statement per batch of ids; returns how many.
    async fn command_requeue_dead_many(&self, params: &CommandRequeueDeadManyParams)
    -> Result<u64>;

    /// One batch of a bulk requeue: reads a page of up to `limit` dead letters matching
    /// the filter, oldest first, leaving out the ones whose unique key a pending row holds,
    /// and puts back the first of each key (and every row without one). Returns how many
    /// rows the page held and how many went back. The default reads the page and updates
    /// the rows in two statements; an engine may do both in one.
    async fn dead_letter_requeue_batch(
        &self,
        params: &DeadLetterPageParams,
    ) -> Result<RequeueBatch> {
        requeue_page(self, params).await
    }

    /// Up to `limit` dead letters matching the filter whose unique key a pending row
    /// holds, oldest first (none on a version-1 table).
    async fn dead_letter_key_conflicts(
        &self,
        params: &DeadLetterPageParams,
    ) -> Result<Vec<KeyConflict>>;

    /// How many finished rows match `filter`.
    async fn finished_count(&self, filter: &FinishedFilter) -> Result<u64>;

    /// Deletes up to `limit` finished rows matching the filter, oldest first, by primary
    /// key; returns how many.
    async fn finished_delete_batch(&self, params: &FinishedDeleteBatchParams) -> Result<u64>;
}

/// `bytes` as text, each byte of an invalid UTF-8 sequence written `\xNN`
/// (`b"job\xff-1"` is shown `job\xFF-1`).
pub(crate) fn escape_invalid_utf8(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02X}"));
        }
    }
    out
}

/// Decodes one row of an engine's state-count query: the five counts, `queue` when
/// counting by queue and `type` when counting by type.
pub(crate) fn decode_state_count<R>(row: &R, params: &StateCountParams) -> Result<StateCount>
where
    R: sqlx::Row,
    i64: sqlx::Type<R::Database> + for<'r> sqlx::Decode<'r, R::Database>,
    String: sqlx::Type<R::Database> + for<'r> sqlx::Decode<'r, R::Database>,
    Vec<u8>: sqlx::Type<R::Database> + for<'r> sqlx::Decode<'r, R::Database>,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
{
    use super::decode_count as count;
    let text = |column: &str| -> Result<String> {
        // Text that is not valid UTF-8 (SQLite stores any bytes as text) is shown with its
        // invalid bytes escaped as `\xNN`, never failing the whole count.
        match row.try_get::<String, _>(column) {
            Ok(name) => Ok(name),
            Err(err) => match row.try_get::<Vec<u8>, _>(column) {
                Ok(bytes) => Ok(escape_invalid_utf8(&bytes)),
                Err(_) => Err(crate::Error::db(format!("decoding a {column}"))(err)),
            },
        }
    };
    Ok(StateCount {
        queue: if params.by_queue {
            Some(text("queue")?)
        } else {
            None
        },
        type_name: if params.by_type {
            Some(text("type")?)
        } else {
            None
        },
        due: count(row, "due")?,
        scheduled: count(row, "scheduled")?,
        running: count(row, "running")?,
        dead: count(row, "dead")?,
        completed: count(row, "completed")?,
    })
}

/// The `SELECT` list head and `GROUP BY … ORDER BY …` tail of a state count: `queue`
/// (a constant `'default'` on a version-1 table, which has one queue) and `type` when
/// asked for; `q` quotes an identifier the engine's way.
pub(crate) fn count_grouping(
    params: &StateCountParams,
    version: u32,
    q: impl Fn(&str) -> String,
) -> (String, String) {
    let mut select = String::new();
    let mut keys = Vec::new();
    if params.by_queue {
        if version >= 2 {
            select.push_str(&format!("{} AS queue, ", q("Queue")));
            keys.push(q("Queue"));
        } else {
            select.push_str("'default' AS queue, ");
        }
    }
    if params.by_type {
        select.push_str(&format!("{} AS type, ", q("Type")));
        keys.push(q("Type"));
    }
    let group = if keys.is_empty() {
        String::new()
    } else {
        let keys = keys.join(", ");
        format!("GROUP BY {keys} ORDER BY {keys}")
    };
    (select, group)
}

/// Requeues the dead letters `ids` with `requeue` (one statement for all of them); when
/// that meets a unique key another writer made pending since the page was read, one row
/// at a time, leaving dead the ones whose key is taken. Returns how many were requeued.
/// `context` says what was being done, for a database error.
pub(crate) async fn requeue_dead_around_taken_keys<'a, I, F, Fut>(
    ids: &'a [I],
    mut requeue: F,
    context: impl Fn() -> String,
) -> Result<u64>
where
    F: FnMut(&'a [I]) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<u64, sqlx::Error>>,
{
    match requeue(ids).await {
        Err(err) if is_unique_violation(&err) => {
            let mut done = 0;
            for id in ids {
                match requeue(std::slice::from_ref(id)).await {
                    Ok(n) => done += n,
                    Err(err) if is_unique_violation(&err) => {}
                    Err(err) => return Err(crate::Error::db(context())(err)),
                }
            }
            Ok(done)
        }
        other => other.map_err(crate::Error::db(context())),
    }
}

/// Whether `err` is a unique-key violation: another writer made a row pending with the
/// unique key a requeue was putting back (between its check and its update).
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .is_some_and(|e| e.is_unique_violation())
}
