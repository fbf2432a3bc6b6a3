//! MySQL 8 / MariaDB 10.6+: every statement icq runs against a MySQL-family source.
//!
//! There is no `UPDATE … RETURNING` here, so a claim is a short transaction: select the
//! due ids `FOR UPDATE SKIP LOCKED`, stamp them with the lease, read them back. Ids and
//! tokens are `CHAR(36)` text and times `DATETIME(6)` in UTC (`UTC_TIMESTAMP(6)`).

mod admin;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::Notify;

use super::{
    Activity, ClaimParams, ConnectOptions, Failure, Lease, QueueOps, marks, parse_uuid as uuid,
};
use crate::command::{CommandId, CommandRow, Context, LeaseToken, NewCommand, RunAt};
use crate::error::{Error, Result};
use crate::ident::{Engine, TableName};
use crate::redact::redact_url;

/// SQL for "now".
pub(crate) const NOW: &str = "UTC_TIMESTAMP(6)";

/// The column list every read uses (JSON read back as text on both MySQL and MariaDB).
pub(crate) const COLUMNS: &str = "`Id`, `Type`, CAST(`Payload` AS CHAR) AS `Payload`, `CreatedAt`, \
     `RunAt`, `Attempts`, `LockToken`, `LockedUntil`, `ProcessedAt`, `DeadLetteredAt`, \
     `LastError`, `UserId`, `Roles`, `TenantId`, `CorrelationId`";

/// A MySQL/MariaDB source: its pool, table and SQL text.
pub struct MySqlDriver {
    pub(crate) pool: MySqlPool,
    pub(crate) table: TableName,
    /// The quoted table name.
    pub(crate) t: String,
    sql: Sql,
}

struct Sql {
    insert: String,
    claim_select: String,
    fail: String,
    sweep: String,
    activity: String,
}

fn insert_sql(t: &str) -> String {
    format!(
        "INSERT INTO {t} (`Id`, `Type`, `Payload`, `RunAt`, `UserId`, `Roles`, `TenantId`, `CorrelationId`) \
         VALUES (?, ?, ?, COALESCE(?, {NOW} + INTERVAL ? MICROSECOND), ?, ?, ?, ?)"
    )
}

impl Sql {
    fn new(t: &str) -> Sql {
        Sql {
            insert: insert_sql(t),
            claim_select: format!(
                "SELECT `Id` FROM {t} \
                 WHERE `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL \
                   AND `RunAt` <= {NOW} \
                   AND (`LockedUntil` IS NULL OR `LockedUntil` <= {NOW}) \
                   AND `CreatedAt` <= {NOW} - INTERVAL ? MICROSECOND \
                 ORDER BY `RunAt` LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            fail: format!(
                "UPDATE {t} SET `LastError` = ?, `LockToken` = NULL, `LockedUntil` = NULL, \
                   `RunAt` = CASE WHEN ? THEN `RunAt` ELSE {NOW} + INTERVAL ? MICROSECOND END, \
                   `DeadLetteredAt` = CASE WHEN ? THEN {NOW} ELSE NULL END \
                 WHERE `Id` = ? AND `LockToken` = ?"
            ),
            sweep: format!(
                "DELETE FROM {t} WHERE `ProcessedAt` IS NOT NULL \
                   AND `ProcessedAt` < {NOW} - INTERVAL ? MICROSECOND \
                 ORDER BY `ProcessedAt` LIMIT ?"
            ),
            activity: format!(
                "SELECT \
                   CAST(COALESCE(SUM(`LockedUntil` IS NULL OR `LockedUntil` <= {NOW}), 0) AS SIGNED) AS due, \
                   CAST(COALESCE(SUM(`LockedUntil` > {NOW}), 0) AS SIGNED) AS running \
                 FROM {t} \
                 WHERE `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL \
                   AND (`RunAt` <= {NOW} OR `LockedUntil` > {NOW})"
            ),
        }
    }
}

/// Microseconds in `d`, for `INTERVAL ? MICROSECOND`.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Inserts `command` through `conn` — a pooled connection or, with `&mut *tx`, the
/// caller's open transaction, so the command commits or rolls back with it.
pub async fn insert_command(
    conn: &mut MySqlConnection,
    table: &TableName,
    command: &NewCommand,
) -> Result<CommandId> {
    let sql = insert_sql(&table.quoted(Engine::Mysql));
    insert_with(conn, &sql, table, command).await
}

async fn insert_with(
    conn: &mut MySqlConnection,
    sql: &str,
    table: &TableName,
    command: &NewCommand,
) -> Result<CommandId> {
    command.validate()?;
    let (at, delay) = match command.run_at {
        RunAt::Now => (None, 0),
        RunAt::At(at) => (Some(at.naive_utc()), 0),
        RunAt::After(delay) => (None, micros(delay)),
    };
    let ctx = &command.context;
    sqlx::query(AssertSqlSafe(sql.to_owned()))
        .bind(command.id.to_string())
        .bind(&command.type_name)
        .bind(command.payload.to_string())
        .bind(at)
        .bind(delay)
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
    row: &MySqlRow,
    column: &str,
) -> std::result::Result<Option<chrono::DateTime<chrono::Utc>>, sqlx::Error> {
    Ok(row
        .try_get::<Option<chrono::NaiveDateTime>, _>(column)?
        .map(|naive| naive.and_utc()))
}

/// Decodes a row read with [`COLUMNS`].
pub(crate) fn decode_row(row: &MySqlRow) -> std::result::Result<CommandRow, sqlx::Error> {
    let id: String = row.try_get("Id")?;
    let payload: String = row.try_get("Payload")?;
    let token: Option<String> = row.try_get("LockToken")?;
    let roles: Option<String> = row.try_get("Roles")?;
    let required = |column: &str| {
        time(row, column)?
            .ok_or_else(|| sqlx::Error::Decode(format!("column {column} is NULL").into()))
    };
    Ok(CommandRow {
        id: CommandId(uuid(&id, "Id")?),
        type_name: row.try_get("Type")?,
        payload: serde_json::from_str(&payload)
            .map_err(|e| sqlx::Error::Decode(format!("column Payload: {e}").into()))?,
        created_at: required("CreatedAt")?,
        run_at: required("RunAt")?,
        attempts: row.try_get("Attempts")?,
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

impl MySqlDriver {
    /// Connects a pool to `url` for `table`. `mariadb://` URLs are accepted as `mysql://`.
    pub async fn connect(url: &str, table: &TableName, options: &ConnectOptions) -> Result<Self> {
        let normalized = match url.strip_prefix("mariadb:") {
            Some(rest) => format!("mysql:{rest}"),
            None => url.to_owned(),
        };
        let pool = MySqlPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .connect(&normalized)
            .await
            .map_err(Error::db(format!("connecting to {}", redact_url(url))))?;
        let t = table.quoted(Engine::Mysql);
        Ok(MySqlDriver {
            pool,
            table: table.clone(),
            sql: Sql::new(&t),
            t,
        })
    }

    /// The pool, for callers that want to run their own transactions.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    fn ctx(&self, what: &str) -> String {
        format!("{what} ({})", self.table)
    }

    /// Runs `UPDATE … SET {set} WHERE LockToken = ? AND Id IN (…)` per token group.
    async fn update_leases(&self, set: &str, leases: &[Lease], what: &str) -> Result<u64> {
        let t = &self.t;
        let mut total = 0;
        for (token, ids) in super::group_by_token(leases) {
            for chunk in ids.chunks(10_000) {
                let sql = format!(
                    "UPDATE {t} SET {set} WHERE `LockToken` = ? AND `Id` IN ({})",
                    marks(chunk.len())
                );
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
impl QueueOps for MySqlDriver {
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
        let t = &self.t;
        let mut ids = Vec::with_capacity(commands.len());
        for chunk in commands.chunks(1000) {
            let row = format!("(?, ?, ?, COALESCE(?, {NOW} + INTERVAL ? MICROSECOND), ?, ?, ?, ?)");
            let sql = format!(
                "INSERT INTO {t} (`Id`, `Type`, `Payload`, `RunAt`, `UserId`, `Roles`, `TenantId`, `CorrelationId`) VALUES {}",
                vec![row.as_str(); chunk.len()].join(", ")
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for command in chunk {
                command.validate()?;
                let (at, delay) = match command.run_at {
                    RunAt::Now => (None, 0),
                    RunAt::At(at) => (Some(at.naive_utc()), 0),
                    RunAt::After(delay) => (None, micros(delay)),
                };
                let ctx = &command.context;
                query = query
                    .bind(command.id.to_string())
                    .bind(command.type_name.clone())
                    .bind(command.payload.to_string())
                    .bind(at)
                    .bind(delay)
                    .bind(ctx.user_id.clone())
                    .bind(ctx.roles_json())
                    .bind(ctx.tenant_id.clone())
                    .bind(ctx.correlation_id.clone());
                ids.push(command.id);
            }
            query
                .execute(&self.pool)
                .await
                .map_err(Error::db(self.ctx("scheduling commands in bulk")))?;
        }
        Ok(ids)
    }

    async fn command_claim(&self, params: &ClaimParams) -> Result<Vec<CommandRow>> {
        let t = &self.t;
        let ctx = || self.ctx("claiming due commands");
        let mut tx = self.pool.begin().await.map_err(Error::db(ctx()))?;
        let ids: Vec<String> = sqlx::query_scalar(AssertSqlSafe(self.sql.claim_select.clone()))
            .bind(micros(params.processing_delay))
            .bind(i64::from(params.limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db(ctx()))?;
        if ids.is_empty() {
            tx.rollback().await.map_err(Error::db(ctx()))?;
            return Ok(Vec::new());
        }
        let update = format!(
            "UPDATE {t} SET `LockToken` = ?, `LockedUntil` = {NOW} + INTERVAL ? MICROSECOND, \
             `Attempts` = `Attempts` + 1 WHERE `Id` IN ({})",
            marks(ids.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(update))
            .bind(params.token.to_string())
            .bind(micros(params.lease));
        for id in &ids {
            query = query.bind(id);
        }
        query.execute(&mut *tx).await.map_err(Error::db(ctx()))?;
        let select = format!(
            "SELECT {COLUMNS} FROM {t} WHERE `Id` IN ({})",
            marks(ids.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(select));
        for id in &ids {
            query = query.bind(id);
        }
        let rows = query.fetch_all(&mut *tx).await.map_err(Error::db(ctx()))?;
        tx.commit().await.map_err(Error::db(ctx()))?;
        rows.iter()
            .map(|row| decode_row(row).map_err(Error::db(self.ctx("decoding a claimed row"))))
            .collect()
    }

    async fn command_get(&self, id: CommandId) -> Result<Option<CommandRow>> {
        let sql = format!("SELECT {COLUMNS} FROM {} WHERE `Id` = ?", self.t);
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
        let set = format!("`ProcessedAt` = {NOW}, `LockToken` = NULL, `LockedUntil` = NULL");
        self.update_leases(&set, leases, "stamping completed commands")
            .await
    }

    async fn command_fail_many(&self, failures: &[Failure]) -> Result<u64> {
        let mut total = 0;
        for f in failures {
            let dead = f.retry_in.is_none();
            total += sqlx::query(AssertSqlSafe(self.sql.fail.clone()))
                .bind(&f.error)
                .bind(dead)
                .bind(micros(f.retry_in.unwrap_or_default()))
                .bind(dead)
                .bind(f.lease.id.to_string())
                .bind(f.lease.token.to_string())
                .execute(&self.pool)
                .await
                .map_err(Error::db(self.ctx("stamping failed commands")))?
                .rows_affected();
        }
        Ok(total)
    }

    async fn command_release_many(&self, leases: &[Lease]) -> Result<u64> {
        let set =
            "`LockToken` = NULL, `LockedUntil` = NULL, `Attempts` = GREATEST(`Attempts` - 1, 0)";
        self.update_leases(set, leases, "releasing leases").await
    }

    async fn completed_delete_batch(&self, older_than: Duration, limit: u32) -> Result<u64> {
        let done = sqlx::query(AssertSqlSafe(self.sql.sweep.clone()))
            .bind(micros(older_than))
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
