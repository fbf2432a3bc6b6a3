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

/// What [`AdminOps::state_count`] groups by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCountParams {
    /// One result per command type (ordered by type) instead of one for the whole table.
    pub by_type: bool,
}

/// How many rows are in each state (for the whole table, or for one type).
///
/// See [`crate::admin::PendingCount`]'s example.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StateCount {
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

/// Which dead letters [`AdminOps::dead_letter_list`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterListParams {
    /// Only this command type.
    pub type_name: Option<String>,
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
    /// Only rows dead-lettered at or before this instant (the operation's start), so a
    /// requeued row that dies again is not picked up a second time.
    pub dead_before: DateTime<Utc>,
}

/// One batch of [`AdminOps::dead_letter_requeue_batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterRequeueBatchParams {
    /// The rows to requeue.
    pub filter: DeadLetterFilter,
    /// At most this many rows in this batch.
    pub limit: u32,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinishedFilter {
    /// Completed rows or dead letters.
    pub kind: FinishedKind,
    /// Only rows finished at or before this instant.
    pub before: DateTime<Utc>,
}

/// One batch of [`AdminOps::finished_delete_batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// Every pending row (due, scheduled and running), in `RunAt` order.
    Pending,
    /// Pending, no live lease, `RunAt <= now`, in `RunAt` order.
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
/// the limit, then each present filter in bind order (type, before, after). The keyset is
/// `(key, Id)`; `key <= k` (or `>=`) keeps it an index range.
pub(crate) fn numbered_list_sql(
    t: &str,
    params: &CommandListParams,
    condition: String,
    sigil: char,
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
    if params.before.is_some() {
        conditions.push(format!("{key} < {}", mark()));
    }
    if params.after.is_some() {
        let id = mark();
        let k = format!(r#"(SELECT {key} FROM {t} WHERE "Id" = {id})"#);
        conditions.push(format!(
            r#"{key} {cmp}= {k} AND ({key} {cmp} {k} OR "Id" {cmp} {id})"#
        ));
    }
    format!(
        r#"SELECT * FROM {t} WHERE {} ORDER BY {key} {dir}, "Id" {dir} LIMIT {sigil}1"#,
        conditions.join(" AND ")
    )
}

/// The rows of [`AdminOps::command_cancel_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandCancelManyParams {
    /// Distinct ids.
    pub ids: Vec<CommandId>,
}

/// Operator queries over one source's table.
/// The rows to read, in any state.
#[derive(Debug, Clone, Copy)]
pub struct CommandGetManyParams<'a> {
    /// Their ids; ids that do not exist are absent from the result.
    pub ids: &'a [CommandId],
}

#[async_trait]
pub trait AdminOps: Send + Sync + 'static {
    /// The database's current time, the reference for every cutoff an operation fixes.
    async fn clock_now(&self) -> Result<DateTime<Utc>>;

    /// Counts rows per state in one aggregate query (per type with `by_type`).
    async fn state_count(&self, params: &StateCountParams) -> Result<Vec<StateCount>>;

    /// Lists dead letters, newest first.
    async fn dead_letter_list(
        &self,
        params: &DeadLetterListParams,
    ) -> Result<Vec<DeadLetterSummary>>;

    /// Reads the rows with these ids, in any state; ids that do not exist are absent.
    async fn command_get_many(&self, params: &CommandGetManyParams<'_>) -> Result<Vec<CommandRow>>;

    /// Puts every listed row back to pending now (`RunAt = now`, `Attempts = 0`,
    /// `DeadLetteredAt` and the lease cleared, `LastError` kept), all or nothing, in one
    /// transaction. A row is requeueable when it is not completed and holds no live lease.
    /// When any id is missing or not requeueable nothing changes and 0 is returned.
    async fn command_requeue_many(&self, params: &CommandRequeueManyParams) -> Result<u64>;

    /// One page of rows in a state, in the state's order (see [`ListState`]).
    async fn command_list(&self, params: &CommandListParams) -> Result<Vec<CommandRow>>;

    /// Dead-letters every listed row that is pending and holds no live lease, with
    /// `LastError` = [`CANCELLED`]; other rows are left alone. Returns how many changed.
    async fn command_cancel_many(&self, params: &CommandCancelManyParams) -> Result<u64>;

    /// How many dead letters match `filter`.
    async fn dead_letter_count(&self, filter: &DeadLetterFilter) -> Result<u64>;

    /// Requeues (as [`AdminOps::command_requeue_many`] does) up to `limit` dead letters
    /// matching the filter, oldest first, in one short statement; returns how many.
    async fn dead_letter_requeue_batch(&self, params: &DeadLetterRequeueBatchParams)
    -> Result<u64>;

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

/// Decodes one row of an engine's state-count query: the five counts, and `type` when
/// counting by type.
pub(crate) fn decode_state_count<R>(row: &R, by_type: bool) -> Result<StateCount>
where
    R: sqlx::Row,
    i64: sqlx::Type<R::Database> + for<'r> sqlx::Decode<'r, R::Database>,
    String: sqlx::Type<R::Database> + for<'r> sqlx::Decode<'r, R::Database>,
    Vec<u8>: sqlx::Type<R::Database> + for<'r> sqlx::Decode<'r, R::Database>,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
{
    use super::decode_count as count;
    Ok(StateCount {
        type_name: if by_type {
            // A `Type` that is not valid UTF-8 (SQLite stores any bytes as text) is shown
            // with its invalid bytes escaped as `\xNN`, never failing the whole count.
            let name = match row.try_get::<String, _>("type") {
                Ok(name) => name,
                Err(err) => match row.try_get::<Vec<u8>, _>("type") {
                    Ok(bytes) => escape_invalid_utf8(&bytes),
                    Err(_) => return Err(crate::Error::db("decoding a type")(err)),
                },
            };
            Some(name)
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
