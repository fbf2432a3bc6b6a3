//! SQLite: every statement icq runs against a SQLite source.
//!
//! SQLite has one writer at a time, so a claim is a single `UPDATE … RETURNING` and the
//! pool waits on the busy timeout rather than failing. Timestamps are UTC text in the
//! fixed format of [`crate::command::format_timestamp`], so text order is time order.

mod admin;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::Notify;

use super::{
    Activity, ClaimParams, ConnectOptions, Failure, Lease, QueueOps, marks, parse_uuid as uuid,
};
use crate::command::{
    CommandId, CommandRow, Context, LeaseToken, NewCommand, RunAt, format_timestamp,
    parse_timestamp,
};
use crate::error::{Error, Result};
use crate::ident::{Engine, TableName};
use crate::redact::redact_url;

/// SQL for "now" in icq's stored format.
pub(crate) const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// Most bound parameters in one statement (SQLite's limit is 32766).
const MAX_PARAMS: usize = 30_000;

/// A SQLite source: its pool, table and SQL text.
pub struct SqliteDriver {
    pub(crate) pool: SqlitePool,
    pub(crate) table: TableName,
    /// The quoted table name.
    pub(crate) t: String,
    sql: Sql,
}

struct Sql {
    insert: String,
    claim: String,
    fail: String,
    sweep: String,
    activity: String,
}

fn insert_sql(t: &str) -> String {
    format!(
        r#"INSERT INTO {t} ("Id", "Type", "Payload", "RunAt", "UserId", "Roles", "TenantId", "CorrelationId")
           VALUES (?, ?, ?, COALESCE(?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?)), ?, ?, ?, ?)"#
    )
}

impl Sql {
    fn new(t: &str) -> Sql {
        Sql {
            insert: insert_sql(t),
            claim: format!(
                r#"UPDATE {t}
                   SET "LockToken" = ?1, "LockedUntil" = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?2),
                       "Attempts" = "Attempts" + 1
                   WHERE "Id" IN (
                       SELECT "Id" FROM {t}
                       WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL
                         AND "RunAt" <= {NOW}
                         AND ("LockedUntil" IS NULL OR "LockedUntil" <= {NOW})
                         AND "CreatedAt" <= strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?3)
                       ORDER BY "RunAt"
                       LIMIT ?4)
                   RETURNING *"#
            ),
            fail: format!(
                r#"UPDATE {t}
                   SET "LastError" = ?3, "LockToken" = NULL, "LockedUntil" = NULL,
                       "RunAt" = CASE WHEN ?5 THEN "RunAt"
                                      ELSE strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?4) END,
                       "DeadLetteredAt" = CASE WHEN ?5 THEN {NOW} ELSE NULL END
                   WHERE "Id" = ?1 AND "LockToken" = ?2"#
            ),
            sweep: format!(
                r#"DELETE FROM {t} WHERE "Id" IN (
                       SELECT "Id" FROM {t}
                       WHERE "ProcessedAt" IS NOT NULL
                         AND "ProcessedAt" < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?1)
                       ORDER BY "ProcessedAt" LIMIT ?2)"#
            ),
            activity: format!(
                r#"SELECT
                       COALESCE(SUM(CASE WHEN "LockedUntil" IS NULL OR "LockedUntil" <= {NOW} THEN 1 ELSE 0 END), 0) AS due,
                       COALESCE(SUM(CASE WHEN "LockedUntil" > {NOW} THEN 1 ELSE 0 END), 0) AS running
                   FROM {t}
                   WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL
                     AND ("RunAt" <= {NOW} OR "LockedUntil" > {NOW})"#
            ),
        }
    }
}

/// A SQLite date modifier moving "now" by `seconds` (which may be negative).
pub(crate) fn offset(seconds: f64) -> String {
    format!("{seconds:+.3} seconds")
}

/// Inserts `command` through `conn` — a pooled connection or, with `&mut *tx`, the
/// caller's open transaction, so the command commits or rolls back with it.
pub async fn insert_command(
    conn: &mut SqliteConnection,
    table: &TableName,
    command: &NewCommand,
) -> Result<CommandId> {
    let sql = insert_sql(&table.quoted(Engine::Sqlite));
    insert_with(conn, &sql, table, command).await
}

async fn insert_with(
    conn: &mut SqliteConnection,
    sql: &str,
    table: &TableName,
    command: &NewCommand,
) -> Result<CommandId> {
    command.validate()?;
    let (at, delay) = match command.run_at {
        RunAt::Now => (None, 0.0),
        RunAt::At(at) => (Some(format_timestamp(at)), 0.0),
        RunAt::After(delay) => (None, delay.as_secs_f64()),
    };
    let ctx = &command.context;
    sqlx::query(AssertSqlSafe(sql.to_owned()))
        .bind(command.id.to_string())
        .bind(&command.type_name)
        .bind(command.payload.to_string())
        .bind(at)
        .bind(offset(delay))
        .bind(&ctx.user_id)
        .bind(ctx.roles_json())
        .bind(&ctx.tenant_id)
        .bind(&ctx.correlation_id)
        .execute(conn)
        .await
        .map_err(Error::db(format!("scheduling a command into {table}")))?;
    Ok(command.id)
}

fn time(
    row: &SqliteRow,
    column: &str,
) -> std::result::Result<Option<chrono::DateTime<chrono::Utc>>, sqlx::Error> {
    let text: Option<String> = row.try_get(column)?;
    match text {
        None => Ok(None),
        Some(text) => parse_timestamp(&text).map(Some).ok_or_else(|| {
            sqlx::Error::Decode(format!("column {column}: `{text}` is not a UTC timestamp").into())
        }),
    }
}

fn required_time(
    row: &SqliteRow,
    column: &str,
) -> std::result::Result<chrono::DateTime<chrono::Utc>, sqlx::Error> {
    time(row, column)?.ok_or_else(|| sqlx::Error::Decode(format!("column {column} is NULL").into()))
}

/// Decodes a full row (`SELECT *` or `RETURNING *`).
pub(crate) fn decode_row(row: &SqliteRow) -> std::result::Result<CommandRow, sqlx::Error> {
    let id: String = row.try_get("Id")?;
    let payload: String = row.try_get("Payload")?;
    let token: Option<String> = row.try_get("LockToken")?;
    let roles: Option<String> = row.try_get("Roles")?;
    let attempts: i64 = row.try_get("Attempts")?;
    Ok(CommandRow {
        id: CommandId(uuid(&id, "Id")?),
        type_name: row.try_get("Type")?,
        payload: serde_json::from_str(&payload)
            .map_err(|e| sqlx::Error::Decode(format!("column Payload: {e}").into()))?,
        created_at: required_time(row, "CreatedAt")?,
        run_at: required_time(row, "RunAt")?,
        attempts: attempts.clamp(0, i64::from(i32::MAX)) as i32,
        lock_token: token
            .as_deref()
            .map(|t| uuid(t, "LockToken").map(LeaseToken))
            .transpose()?,
        locked_until: time(row, "LockedUntil")?,
        processed_at: time(row, "ProcessedAt")?,
        dead_lettered_at: time(row, "DeadLetteredAt")?,
        last_error: row.try_get("LastError")?,
        user_id: row.try_get("UserId")?,
        roles: Context::parse_roles(roles.as_deref()),
        tenant_id: row.try_get("TenantId")?,
        correlation_id: row.try_get("CorrelationId")?,
    })
}

impl SqliteDriver {
    /// Opens a pool on `url` for `table`: WAL journal, a generous busy timeout.
    pub async fn connect(url: &str, table: &TableName, options: &ConnectOptions) -> Result<Self> {
        let connect = SqliteConnectOptions::from_str(url)
            .map_err(Error::db(format!("parsing {}", redact_url(url))))?
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(options.max_connections.clamp(1, 8))
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect)
            .await
            .map_err(Error::db(format!("opening {}", redact_url(url))))?;
        let t = table.quoted(Engine::Sqlite);
        Ok(SqliteDriver {
            pool,
            table: table.clone(),
            sql: Sql::new(&t),
            t,
        })
    }

    /// The pool, for callers that want to run their own transactions.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn ctx(&self, what: &str) -> String {
        format!("{what} ({})", self.table)
    }

    /// Runs `UPDATE … SET {set} WHERE "LockToken" = ? AND "Id" IN (…)` per token group.
    async fn update_leases(&self, set: &str, leases: &[Lease], what: &str) -> Result<u64> {
        let t = &self.t;
        let mut total = 0;
        for (token, ids) in super::group_by_token(leases) {
            for chunk in ids.chunks(MAX_PARAMS) {
                let marks = marks(chunk.len());
                let sql =
                    format!(r#"UPDATE {t} SET {set} WHERE "LockToken" = ? AND "Id" IN ({marks})"#);
                let mut query = sqlx::query(AssertSqlSafe(sql)).bind(token.to_string());
                for id in chunk {
                    query = query.bind(id.to_string());
                }
                total += query
                    .execute(&self.pool)
                    .await
                    .map_err(Error::db(self.ctx(what)))?
                    .rows_affected();
            }
        }
        Ok(total)
    }
}

#[async_trait]
impl QueueOps for SqliteDriver {
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

    async fn schema_apply(&self, ddl: &str) -> Result<()> {
        sqlx::raw_sql(AssertSqlSafe(ddl.to_owned()))
            .execute(&self.pool)
            .await
            .map_err(Error::db(self.ctx("creating the commands table")))?;
        Ok(())
    }

    async fn command_insert(&self, command: &NewCommand) -> Result<CommandId> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(Error::db(self.ctx("scheduling a command")))?;
        insert_with(&mut conn, &self.sql.insert, &self.table, command).await
    }

    async fn command_insert_many(&self, commands: &[NewCommand]) -> Result<Vec<CommandId>> {
        let mut ids = Vec::with_capacity(commands.len());
        for chunk in commands.chunks(1000) {
            let mut tx = self
                .pool
                .begin()
                .await
                .map_err(Error::db(self.ctx("scheduling commands in bulk")))?;
            for command in chunk {
                ids.push(insert_with(&mut tx, &self.sql.insert, &self.table, command).await?);
            }
            tx.commit()
                .await
                .map_err(Error::db(self.ctx("committing a bulk schedule")))?;
        }
        Ok(ids)
    }

    async fn command_claim(&self, params: &ClaimParams) -> Result<Vec<CommandRow>> {
        let rows = sqlx::query(AssertSqlSafe(self.sql.claim.clone()))
            .bind(params.token.to_string())
            .bind(offset(params.lease.as_secs_f64()))
            .bind(offset(-params.processing_delay.as_secs_f64()))
            .bind(i64::from(params.limit))
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(self.ctx("claiming due commands")))?;
        rows.iter()
            .map(|row| decode_row(row).map_err(Error::db(self.ctx("decoding a claimed row"))))
            .collect()
    }

    async fn command_get(&self, id: CommandId) -> Result<Option<CommandRow>> {
        let sql = format!(r#"SELECT * FROM {} WHERE "Id" = ?"#, self.t);
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db(self.ctx("reading a command")))?;
        row.as_ref()
            .map(|r| decode_row(r).map_err(Error::db(self.ctx("decoding a command"))))
            .transpose()
    }

    async fn command_complete_many(&self, leases: &[Lease]) -> Result<u64> {
        let set = format!(r#""ProcessedAt" = {NOW}, "LockToken" = NULL, "LockedUntil" = NULL"#);
        self.update_leases(&set, leases, "stamping completed commands")
            .await
    }

    async fn command_fail_many(&self, failures: &[Failure]) -> Result<u64> {
        let mut total = 0;
        for f in failures {
            total += sqlx::query(AssertSqlSafe(self.sql.fail.clone()))
                .bind(f.lease.id.to_string())
                .bind(f.lease.token.to_string())
                .bind(&f.error)
                .bind(offset(f.retry_in.map_or(0.0, |d| d.as_secs_f64())))
                .bind(f.retry_in.is_none())
                .execute(&self.pool)
                .await
                .map_err(Error::db(self.ctx("stamping failed commands")))?
                .rows_affected();
        }
        Ok(total)
    }

    async fn command_release_many(&self, leases: &[Lease]) -> Result<u64> {
        let set =
            r#""LockToken" = NULL, "LockedUntil" = NULL, "Attempts" = MAX("Attempts" - 1, 0)"#;
        self.update_leases(set, leases, "releasing leases").await
    }

    async fn completed_delete_batch(&self, older_than: Duration, limit: u32) -> Result<u64> {
        let done = sqlx::query(AssertSqlSafe(self.sql.sweep.clone()))
            .bind(offset(-older_than.as_secs_f64()))
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await
            .map_err(Error::db(self.ctx("deleting old completed commands")))?;
        Ok(done.rows_affected())
    }

    async fn activity(&self) -> Result<Activity> {
        let row = sqlx::query(AssertSqlSafe(self.sql.activity.clone()))
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting due commands")))?;
        super::decode_activity(&row)
    }

    async fn listen(&self, _notify: Arc<Notify>) -> Result<bool> {
        Ok(false)
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}
