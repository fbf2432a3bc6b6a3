//! The engine seam: one trait of Noun+Verb operations that the processor and the operator
//! commands call, implemented once per engine in `postgres/`, `sqlite/` and `mysql/`.
//!
//! Every SQL statement icq runs at runtime lives in those three folders; code outside
//! `engine` never builds SQL and never matches on the engine. Outcome stamps are always
//! guarded by the lease token, so a processor whose lease expired cannot overwrite the
//! work of the one that took the row over.

pub mod admin;
pub mod mysql;
pub mod postgres;
pub mod sqlite;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::command::{CommandId, CommandRow, LeaseToken, NewCommand};
use crate::error::Result;
use crate::ident::{Engine, TableName};

pub use admin::AdminOps;

/// What to claim: the due prefix of a batch under one fresh lease token.
#[derive(Debug, Clone)]
pub struct ClaimParams {
    /// Most rows to claim (never more than free execution slots).
    pub limit: u32,
    /// The lease: claimed rows are held until `now + lease`.
    pub lease: Duration,
    /// Rows younger than this (by `CreatedAt`) are not claimed.
    pub processing_delay: Duration,
    /// The token written into `LockToken`.
    pub token: LeaseToken,
}

/// One claimed row's lease: the pair every outcome stamp is guarded by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The row.
    pub id: CommandId,
    /// The token of the claim that holds it.
    pub token: LeaseToken,
}

/// A failed attempt to stamp.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The row and its lease.
    pub lease: Lease,
    /// The text stored in `LastError`.
    pub error: String,
    /// `Some(delay)` retries after `delay`; `None` dead-letters the row.
    pub retry_in: Option<Duration>,
}

/// Counts used to decide whether a processor is idle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    /// Pending rows with `RunAt <= now` and no live lease.
    pub due: u64,
    /// Pending rows with a live lease.
    pub running: u64,
}

/// The queue operations of one source's table.
#[async_trait]
pub trait QueueOps: Send + Sync + 'static {
    /// The engine this driver speaks.
    fn engine(&self) -> Engine;

    /// The table it works on.
    fn table(&self) -> &TableName;

    /// Fails with [`crate::Error::TableMissing`]-style detail when the table does not exist.
    async fn table_exists(&self) -> Result<bool>;

    /// Runs a DDL script (the embedded default creating its table on first use).
    async fn schema_apply(&self, ddl: &str) -> Result<()>;

    /// Inserts one command on its own (autocommit) and returns its id.
    async fn command_insert(&self, command: &NewCommand) -> Result<CommandId>;

    /// Inserts many commands in bulk, in one transaction per chunk.
    async fn command_insert_many(&self, commands: &[NewCommand]) -> Result<Vec<CommandId>>;

    /// Claims up to `limit` due rows in one statement; increments `Attempts` on each.
    async fn command_claim(&self, params: &ClaimParams) -> Result<Vec<CommandRow>>;

    /// Reads one row by id.
    async fn command_get(&self, id: CommandId) -> Result<Option<CommandRow>>;

    /// Stamps successes, guarded by each lease token; returns how many rows were stamped.
    async fn command_complete_many(&self, leases: &[Lease]) -> Result<u64>;

    /// Stamps failures (retry or dead-letter), guarded by each lease token; returns how
    /// many rows were stamped.
    async fn command_fail_many(&self, failures: &[Failure]) -> Result<u64>;

    /// Releases claimed-but-unstarted rows so another processor may take them at once;
    /// the attempt the claim consumed is given back.
    async fn command_release_many(&self, leases: &[Lease]) -> Result<u64>;

    /// Deletes up to `limit` completed rows older than `older_than`; returns how many.
    async fn completed_delete_batch(&self, older_than: Duration, limit: u32) -> Result<u64>;

    /// How many rows are due and running right now.
    async fn activity(&self) -> Result<Activity>;

    /// Starts listening for inserts committed by any client, signalling `notify` on each.
    /// Returns `false` where the engine has no such mechanism (the poll covers it).
    async fn listen(&self, notify: Arc<Notify>) -> Result<bool>;

    /// Closes the connection pool.
    async fn close(&self);
}

/// Everything one source's driver offers: queue operations plus operator queries.
pub trait Backend: QueueOps + AdminOps {}

impl<T: QueueOps + AdminOps> Backend for T {}

/// Connection options for a driver.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Most pooled connections.
    pub max_connections: u32,
    /// How long to wait for a connection before failing.
    pub acquire_timeout: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
        }
    }
}

/// Opens a driver for `url` (engine from the scheme) on `table`.
pub async fn connect(
    url: &str,
    table: &TableName,
    options: &ConnectOptions,
) -> Result<Arc<dyn Backend>> {
    match Engine::from_url(url)? {
        Engine::Postgres => Ok(Arc::new(
            postgres::PgDriver::connect(url, table, options).await?,
        )),
        Engine::Sqlite => Ok(Arc::new(
            sqlite::SqliteDriver::connect(url, table, options).await?,
        )),
        Engine::Mysql => Ok(Arc::new(
            mysql::MySqlDriver::connect(url, table, options).await?,
        )),
        Engine::SqlServer => Err(crate::Error::Usage(
            "SQL Server is supported for migrations only (`icq migrate add --engine sqlserver`); \
             the processor and operator commands need PostgreSQL, SQLite or MySQL/MariaDB"
                .into(),
        )),
    }
}

/// Groups leases by token (a completion batch usually spans a handful of claims), for
/// engines that stamp with `"LockToken" = ? AND "Id" IN (…)`.
pub(crate) fn group_by_token(leases: &[Lease]) -> Vec<(LeaseToken, Vec<CommandId>)> {
    let mut groups: Vec<(LeaseToken, Vec<CommandId>)> = Vec::new();
    for lease in leases {
        match groups.iter_mut().find(|(token, _)| *token == lease.token) {
            Some((_, ids)) => ids.push(lease.id),
            None => groups.push((lease.token, vec![lease.id])),
        }
    }
    groups
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

/// Parses a UUID stored as text (SQLite, MySQL), naming the column when it is not one.
pub(crate) fn parse_uuid(text: &str, column: &str) -> std::result::Result<uuid::Uuid, sqlx::Error> {
    uuid::Uuid::parse_str(text)
        .map_err(|e| sqlx::Error::Decode(format!("column {column}: `{text}`: {e}").into()))
}

/// `?, ?, …` with `n` markers (SQLite and MySQL placeholders for an `IN (…)` list).
pub(crate) fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}
