//! MySQL 8 / MariaDB 10.6+: every statement icq runs against a MySQL-family source.
//!
//! There is no `UPDATE … RETURNING` here, so a claim is a short transaction: select the
//! due ids `FOR UPDATE SKIP LOCKED`, stamp them with the lease, read them back. Ids and
//! tokens are `CHAR(36)` text and times `DATETIME(6)` in UTC (`UTC_TIMESTAMP(6)`).

mod admin;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlRow};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::Notify;

use chrono::{DateTime, Utc};

use super::decode::{Decoder, text_columns, text_id, text_token};
use super::{
    Activity, BenchFillCompletedParams, ClaimParams, ClaimedRow, CommandGetParams,
    CommandInsertManyParams, CommandInsertParams, CommandSetStateAndClaimParams,
    CommandSetStateManyParams, ConnectOptions, Lease, LeaseExtendManyParams,
    LeaseOthersAtHeadParams, Lifecycle, QueueOps, SetState, SweepParams, marks,
};
use crate::command::{CommandId, CommandRow, NewCommand, RunAt};
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
    /// The table's schema version, once looked up.
    version: super::SchemaVersionCache,
}

struct Sql {
    insert: Arc<str>,
    set_state: Arc<str>,
    extend: Arc<str>,
    extended: Arc<str>,
    sweep: Arc<str>,
    activity: Arc<str>,
}

/// One row of an insert: nine parameters.
const INSERT_ROW: &str =
    "(?, ?, ?, COALESCE(?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), ?, ?, ?, ?)";

/// Rows per multi-row insert.
const INSERT_ROWS_PER_STATEMENT: usize = 1000;

fn insert_sql(t: &str) -> String {
    format!(
        "INSERT INTO {t} (`Id`, `Type`, `Payload`, `RunAt`, `UserId`, `Roles`, `TenantId`, `CorrelationId`) \
         VALUES {INSERT_ROW}"
    )
}

/// The leases of a JSON array of `[id, token, kind, delay µs or -1, error]` arrays as a
/// table `s`. Ids compare binary, exactly as stored, whatever the connection collation.
fn leases_join(t: &str) -> String {
    format!(
        "{t} AS c JOIN JSON_TABLE(?, '$[*]' COLUMNS ( \
             id VARCHAR(255) PATH '$[0]', token VARCHAR(64) PATH '$[1]', kind INT PATH '$[2]', \
             delay BIGINT PATH '$[3]', error LONGTEXT PATH '$[4]')) AS s \
           ON c.`Id` = s.id COLLATE utf8mb4_bin AND c.`LockToken` = s.token COLLATE utf8mb4_bin"
    )
}

impl Sql {
    fn new(t: &str) -> Sql {
        let leases = leases_join(t);
        Sql {
            insert: insert_sql(t).into(),
            // Every outcome kind in one statement: 0 completed, 1 retry, 2 dead, 3 release.
            set_state: format!(
                "UPDATE {leases} SET \
                   c.`ProcessedAt` = CASE WHEN s.kind = 0 THEN {NOW} ELSE c.`ProcessedAt` END, \
                   c.`DeadLetteredAt` = CASE WHEN s.kind = 2 THEN {NOW} ELSE c.`DeadLetteredAt` END, \
                   c.`RunAt` = CASE WHEN s.delay >= 0 THEN {NOW} + INTERVAL s.delay MICROSECOND \
                                    ELSE c.`RunAt` END, \
                   c.`LastError` = CASE WHEN s.kind IN (1, 2) THEN s.error ELSE c.`LastError` END, \
                   c.`Attempts` = CASE WHEN s.kind = 3 THEN GREATEST(c.`Attempts` - 1, 0) \
                                       ELSE c.`Attempts` END, \
                   c.`LockToken` = NULL, c.`LockedUntil` = NULL"
            )
            .into(),
            extend: format!(
                "UPDATE {leases} SET c.`LockedUntil` = {NOW} + INTERVAL ? MICROSECOND"
            )
            .into(),
            extended: format!("SELECT c.`Id`, c.`LockToken` FROM {leases}").into(),
            sweep: format!(
                "DELETE FROM {t} WHERE `ProcessedAt` IS NOT NULL \
                   AND `ProcessedAt` < {NOW} - INTERVAL ? MICROSECOND \
                 ORDER BY `ProcessedAt` LIMIT ?"
            )
            .into(),
            activity: format!(
                "SELECT \
                   CAST(COALESCE(SUM(`LockedUntil` IS NULL OR `LockedUntil` <= {NOW}), 0) AS SIGNED) AS due, \
                   CAST(COALESCE(SUM(`LockedUntil` > {NOW}), 0) AS SIGNED) AS running \
                 FROM {t} \
                 WHERE `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL \
                   AND (`RunAt` <= {NOW} OR `RunAt` IS NULL OR `LockedUntil` > {NOW})"
            )
            .into(),
        }
    }
}

/// The select of a claim; with `types`, only those types; never the `except` ids that
/// follow them (the rows the same transaction has just stamped, which a release or a
/// retry without delay leaves due, are not claimed back, as on PostgreSQL, whose one
/// statement sees them leased).
fn claim_select_sql(t: &str, types: usize, except: usize) -> String {
    let mut filter = if types == 0 {
        String::new()
    } else {
        format!(" AND `Type` IN ({})", marks(types))
    };
    if except > 0 {
        filter.push_str(&format!(" AND `Id` NOT IN ({})", marks(except)));
    }
    // The second part: a few pending rows whose `RunAt` is NULL (another program relaxed
    // NOT NULL), which no time makes due: claimed as they are, dead-lettered by the
    // executor naming the column. A seek on the `RunAt` index.
    format!(
        "(SELECT `Id` FROM {t} \
         WHERE `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL \
           AND `RunAt` <= {NOW} \
           AND (`LockedUntil` IS NULL OR `LockedUntil` <= {NOW}) \
           AND (`CreatedAt` <= {NOW} - INTERVAL ? MICROSECOND OR `CreatedAt` IS NULL){filter} \
         ORDER BY `RunAt` LIMIT ? FOR UPDATE SKIP LOCKED) \
         UNION ALL \
         (SELECT `Id` FROM {t} \
         WHERE `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL AND `RunAt` IS NULL \
           AND (`LockedUntil` IS NULL OR `LockedUntil` <= {NOW}) \
         LIMIT 10 FOR UPDATE SKIP LOCKED)"
    )
}

/// The JSON array the lease statements read with `JSON_TABLE`.
fn leases_json<'a>(rows: impl Iterator<Item = (&'a Lease, i16, i64, Option<String>)>) -> String {
    let rows: Vec<serde_json::Value> = rows
        .map(|(lease, kind, delay, error)| {
            serde_json::json!([
                lease.id.as_str(),
                lease.token.to_string(),
                kind,
                delay,
                error
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
/// caller's open transaction, so the command commits or rolls back with it.
pub async fn insert_command(
    conn: &mut MySqlConnection,
    table: &TableName,
    command: &NewCommand,
) -> Result<CommandId> {
    let sql: Arc<str> = insert_sql(&table.quoted(Engine::Mysql)).into();
    insert_rows(conn, &sql, table, std::slice::from_ref(command)).await?;
    Ok(command.id.clone())
}

/// Inserts `commands` with one multi-row statement (`sql` has one row per command).
async fn insert_rows(
    conn: &mut MySqlConnection,
    sql: &Arc<str>,
    table: &TableName,
    commands: &[NewCommand],
) -> Result<()> {
    let mut query = sqlx::query(AssertSqlSafe(sql.clone()));
    for command in commands {
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
    }
    query
        .execute(conn)
        .await
        .map_err(Error::db(format!("scheduling commands into {table}")))?;
    Ok(())
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
    Ok(d.finish(out))
}

impl MySqlDriver {
    /// Connects a pool to `url` for `table`. `mariadb://` URLs are accepted as `mysql://`.
    pub async fn connect(url: &str, table: &TableName, options: &ConnectOptions) -> Result<Self> {
        let normalized = match url.strip_prefix("mariadb:") {
            Some(rest) => format!("mysql:{rest}"),
            None => url.to_owned(),
        };
        let pool = options
            .pool::<sqlx::MySql>()
            .connect(&normalized)
            .await
            .map_err(Error::db(format!("connecting to {}", redact_url(url))))?;
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
                pool.close().await;
                return Err(Error::schema_missing(table, Engine::Mysql));
            }
        }
        let t = table.quoted(Engine::Mysql);
        Ok(MySqlDriver {
            pool,
            table: table.clone(),
            sql: Sql::new(&t),
            t,
            version: Default::default(),
        })
    }

    fn ctx(&self, what: &str) -> String {
        format!("{what} ({})", self.table)
    }

    /// The claim's three statements, inside the caller's transaction; never the rows of
    /// `except`.
    async fn claim_on(
        &self,
        conn: &mut MySqlConnection,
        params: &ClaimParams,
        except: &[SetState],
    ) -> Result<Vec<ClaimedRow>> {
        let t = &self.t;
        let ctx = || self.ctx("claiming due commands");
        let types = params.types.as_deref().unwrap_or(&[]);
        let sql = claim_select_sql(t, types.len(), except.len());
        let mut select =
            sqlx::query_scalar(AssertSqlSafe(sql)).bind(micros(params.processing_delay));
        for type_name in types {
            select = select.bind(type_name.clone());
        }
        for change in except {
            select = select.bind(change.lease.id.as_str().to_owned());
        }
        let ids: Vec<String> = select
            .bind(i64::from(params.limit))
            .fetch_all(&mut *conn)
            .await
            .map_err(Error::db(ctx()))?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
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
        let select = format!(
            "SELECT {COLUMNS} FROM {t} WHERE `Id` IN ({})",
            marks(ids.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(select));
        for id in &ids {
            query = query.bind(id);
        }
        let rows = query
            .fetch_all(&mut *conn)
            .await
            .map_err(Error::db(ctx()))?;
        // Consumed in order: each raw row is dropped once decoded, so a claim of large
        // payloads never holds every raw row and every decoded one at once.
        Ok(super::leased_rows(
            &self.table,
            params.token,
            rows.into_iter()
                .map(|row| (decode_row(&row), payload_bytes(&row))),
        ))
    }

    async fn set_state_on(&self, conn: &mut MySqlConnection, changes: &[SetState]) -> Result<u64> {
        if changes.is_empty() {
            return Ok(0);
        }
        let json = leases_json(changes.iter().map(|c| {
            let delay = c
                .delay_seconds()
                .map_or(-1, |s| micros(Duration::from_secs_f64(s.max(0.0))));
            (&c.lease, c.kind(), delay, c.error())
        }));
        let done = sqlx::query(AssertSqlSafe(self.sql.set_state.clone()))
            .bind(json)
            .execute(&mut *conn)
            .await
            .map_err(Error::db(self.ctx("stamping outcomes")))?;
        Ok(done.rows_affected())
    }
}

#[async_trait]
impl QueueOps for MySqlDriver {
    /// Two: four replicas with four claims each drained at 0.61× one replica (InnoDB's
    /// `SKIP LOCKED` claims contend on the same index range), two claims each at 0.96×.
    fn claims_in_flight(&self) -> usize {
        2
    }

    async fn command_insert(&self, params: &CommandInsertParams<'_>) -> Result<CommandId> {
        let command = params.command;
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(Error::db(self.ctx("scheduling a command")))?;
        insert_rows(
            &mut conn,
            &self.sql.insert,
            &self.table,
            std::slice::from_ref(command),
        )
        .await?;
        Ok(command.id.clone())
    }

    async fn command_insert_many(
        &self,
        params: &CommandInsertManyParams<'_>,
    ) -> Result<Vec<CommandId>> {
        let commands = params.commands;
        let t = &self.t;
        let ctx = || self.ctx("scheduling commands in bulk");
        let mut tx = self.pool.begin().await.map_err(Error::db(ctx()))?;
        let mut full: Option<Arc<str>> = None;
        for chunk in commands.chunks(INSERT_ROWS_PER_STATEMENT) {
            let render = || -> Arc<str> {
                format!(
                    "INSERT INTO {t} (`Id`, `Type`, `Payload`, `RunAt`, `UserId`, `Roles`, `TenantId`, `CorrelationId`) VALUES {}",
                    vec![INSERT_ROW; chunk.len()].join(", ")
                )
                .into()
            };
            let sql = if chunk.len() == INSERT_ROWS_PER_STATEMENT {
                full.get_or_insert_with(render).clone()
            } else {
                render()
            };
            insert_rows(&mut tx, &sql, &self.table, chunk).await?;
        }
        tx.commit().await.map_err(Error::db(ctx()))?;
        Ok(commands.iter().map(|c| c.id.clone()).collect())
    }

    async fn command_claim(&self, params: &ClaimParams) -> Result<Vec<ClaimedRow>> {
        let ctx = || self.ctx("claiming due commands");
        let mut tx = self.pool.begin().await.map_err(Error::db(ctx()))?;
        let claimed = self.claim_on(&mut tx, params, &[]).await?;
        tx.commit().await.map_err(Error::db(ctx()))?;
        Ok(claimed)
    }

    async fn command_set_state_and_claim(
        &self,
        params: &CommandSetStateAndClaimParams<'_>,
    ) -> Result<(u64, Vec<ClaimedRow>)> {
        let (changes, params) = (params.changes, params.claim);
        let ctx = || self.ctx("stamping outcomes and claiming due commands");
        let mut tx = self.pool.begin().await.map_err(Error::db(ctx()))?;
        let stamped = self.set_state_on(&mut tx, changes).await?;
        let claimed = self.claim_on(&mut tx, params, changes).await?;
        tx.commit().await.map_err(Error::db(ctx()))?;
        Ok((stamped, claimed))
    }

    async fn command_get(&self, params: &CommandGetParams<'_>) -> Result<Option<CommandRow>> {
        let id = params.id;
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

    async fn command_set_state_many(&self, params: &CommandSetStateManyParams<'_>) -> Result<u64> {
        let changes = params.changes;
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(Error::db(self.ctx("stamping outcomes")))?;
        self.set_state_on(&mut conn, changes).await
    }

    async fn lease_extend_many(&self, params: &LeaseExtendManyParams) -> Result<Vec<Lease>> {
        let (leases, lease) = (params.leases.as_slice(), params.lease);
        let ctx = || self.ctx("extending leases");
        let json = leases_json(leases.iter().map(|l| (l, 0, -1, None)));
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
        // One replica sweeps at a time: the others skip the round.
        let locked: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
            .bind(&lock)
            .fetch_one(&mut *conn)
            .await
            .map_err(Error::db(ctx()))?;
        if locked != Some(1) {
            return Ok(None);
        }
        let done = sqlx::query(AssertSqlSafe(self.sql.sweep.clone()))
            .bind(micros(params.older_than))
            .bind(i64::from(params.limit))
            .execute(&mut *conn)
            .await;
        let released = sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(&lock)
            .execute(&mut *conn)
            .await;
        let done = done.map_err(Error::db(ctx()))?;
        released.map_err(Error::db(ctx()))?;
        Ok(Some(done.rows_affected()))
    }

    async fn activity(&self) -> Result<Activity> {
        let row = sqlx::query(AssertSqlSafe(self.sql.activity.clone()))
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting due commands")))?;
        super::decode_activity(&row)
    }

    async fn lease_others_at_head(&self, params: &LeaseOthersAtHeadParams) -> Result<u64> {
        let sql = format!(
            "SELECT CAST(COUNT(*) AS SIGNED) AS others FROM ( \
                   SELECT `LockToken`, `LockedUntil` FROM {t} \
                   WHERE `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL AND `RunAt` <= {now} \
                   ORDER BY `RunAt` LIMIT ?) AS head \
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
                let found: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM information_schema.columns \
                     WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? \
                       AND column_name = 'Queue'",
                )
                .bind(self.table.schema())
                .bind(self.table.name())
                .fetch_one(&self.pool)
                .await
                .map_err(Error::db(self.ctx("looking up the table's schema version")))?;
                Ok(Some(found > 0))
            })
            .await
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

    async fn listen(&self, _notify: Arc<Notify>, _cancelled: Arc<Notify>) -> Result<bool> {
        Ok(false)
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    async fn table_drop(&self) -> Result<()> {
        let ddl = crate::schema::render(Engine::Mysql, &self.table).down;
        super::run_script(&self.pool, ddl, self.ctx("dropping the table")).await
    }
}
