//! PostgreSQL: every statement icq runs against a PostgreSQL source.
//!
//! Claims use `FOR UPDATE SKIP LOCKED` so replicas never wait on each other; outcome
//! stamps take arrays (`unnest`) so a whole batch is one statement; wake-ups come from the
//! migration's statement-level trigger through `LISTEN`.

mod admin;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnection, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::Notify;
use uuid::Uuid;

use super::{Activity, ClaimParams, ConnectOptions, Failure, Lease, QueueOps};
use crate::command::{CommandId, CommandRow, Context, LeaseToken, NewCommand, RunAt};
use crate::error::{Error, Result};
use crate::ident::{Engine, TableName};
use crate::redact::redact_url;

/// Rows per statement for bulk inserts.
const INSERT_CHUNK: usize = 1000;

/// A PostgreSQL source: its pool, table and prepared SQL text.
pub struct PgDriver {
    pub(crate) pool: PgPool,
    pub(crate) table: TableName,
    /// The quoted, possibly schema-qualified table name.
    pub(crate) t: String,
    url: String,
    sql: Sql,
    listener: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The statements of the queue path, rendered once per table.
struct Sql {
    insert: String,
    insert_many: String,
    claim: String,
    complete: String,
    fail: String,
    release: String,
    sweep: String,
    activity: String,
}

impl Sql {
    fn new(t: &str) -> Sql {
        Sql {
            insert: insert_sql(t),
            insert_many: format!(
                r#"INSERT INTO {t} ("Id", "Type", "Payload", "RunAt", "UserId", "Roles", "TenantId", "CorrelationId")
                   SELECT s.id, s.type, s.payload::jsonb, COALESCE(s.run_at, now() + make_interval(secs => s.delay)),
                          s.user_id, s.roles, s.tenant_id, s.correlation_id
                   FROM unnest($1::uuid[], $2::text[], $3::text[], $4::timestamptz[], $5::float8[],
                               $6::text[], $7::text[], $8::text[], $9::text[])
                        AS s(id, type, payload, run_at, delay, user_id, roles, tenant_id, correlation_id)"#
            ),
            claim: format!(
                r#"WITH due AS (
                       SELECT "Id" FROM {t}
                       WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL
                         AND "RunAt" <= now()
                         AND ("LockedUntil" IS NULL OR "LockedUntil" <= now())
                         AND "CreatedAt" <= now() - make_interval(secs => $3)
                       ORDER BY "RunAt"
                       LIMIT $1
                       FOR UPDATE SKIP LOCKED)
                   UPDATE {t} AS c
                   SET "LockToken" = $2, "LockedUntil" = now() + make_interval(secs => $4),
                       "Attempts" = c."Attempts" + 1
                   FROM due WHERE c."Id" = due."Id"
                   RETURNING c.*"#
            ),
            complete: format!(
                r#"UPDATE {t} AS c
                   SET "ProcessedAt" = now(), "LockToken" = NULL, "LockedUntil" = NULL
                   FROM unnest($1::uuid[], $2::uuid[]) AS s(id, token)
                   WHERE c."Id" = s.id AND c."LockToken" = s.token"#
            ),
            fail: format!(
                r#"UPDATE {t} AS c
                   SET "LastError" = s.error, "LockToken" = NULL, "LockedUntil" = NULL,
                       "RunAt" = CASE WHEN s.dead THEN c."RunAt"
                                      ELSE now() + make_interval(secs => s.delay) END,
                       "DeadLetteredAt" = CASE WHEN s.dead THEN now() ELSE NULL END
                   FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::float8[], $5::bool[])
                        AS s(id, token, error, delay, dead)
                   WHERE c."Id" = s.id AND c."LockToken" = s.token"#
            ),
            release: format!(
                r#"UPDATE {t} AS c
                   SET "LockToken" = NULL, "LockedUntil" = NULL,
                       "Attempts" = GREATEST(c."Attempts" - 1, 0)
                   FROM unnest($1::uuid[], $2::uuid[]) AS s(id, token)
                   WHERE c."Id" = s.id AND c."LockToken" = s.token"#
            ),
            sweep: format!(
                r#"DELETE FROM {t} WHERE "Id" IN (
                       SELECT "Id" FROM {t}
                       WHERE "ProcessedAt" IS NOT NULL
                         AND "ProcessedAt" < now() - make_interval(secs => $1)
                       ORDER BY "ProcessedAt" LIMIT $2)"#
            ),
            activity: format!(
                r#"SELECT count(*) FILTER (WHERE "LockedUntil" IS NULL OR "LockedUntil" <= now()) AS due,
                          count(*) FILTER (WHERE "LockedUntil" > now()) AS running
                   FROM {t}
                   WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL
                     AND ("RunAt" <= now() OR "LockedUntil" > now())"#
            ),
        }
    }
}

fn insert_sql(t: &str) -> String {
    format!(
        r#"INSERT INTO {t} ("Id", "Type", "Payload", "RunAt", "UserId", "Roles", "TenantId", "CorrelationId")
           VALUES ($1, $2, $3, COALESCE($4, now() + make_interval(secs => $5)), $6, $7, $8, $9)"#
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
/// caller's open transaction, so the command commits or rolls back with it.
pub async fn insert_command(
    conn: &mut PgConnection,
    table: &TableName,
    command: &NewCommand,
) -> Result<CommandId> {
    let sql = insert_sql(&table.quoted(Engine::Postgres));
    insert_with(conn, &sql, table, command).await
}

async fn insert_with(
    conn: &mut PgConnection,
    sql: &str,
    table: &TableName,
    command: &NewCommand,
) -> Result<CommandId> {
    command.validate()?;
    let (at, delay) = run_at_parts(command.run_at);
    let ctx = &command.context;
    sqlx::query(AssertSqlSafe(sql.to_owned()))
        .bind(command.id.0)
        .bind(&command.type_name)
        .bind(sqlx::types::Json(&command.payload))
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

/// Decodes a full row (`SELECT *` or `RETURNING *`).
pub(crate) fn decode_row(row: &PgRow) -> std::result::Result<CommandRow, sqlx::Error> {
    let payload: sqlx::types::Json<serde_json::Value> = row.try_get("Payload")?;
    let roles: Option<String> = row.try_get("Roles")?;
    Ok(CommandRow {
        id: CommandId(row.try_get("Id")?),
        type_name: row.try_get("Type")?,
        payload: payload.0,
        created_at: row.try_get("CreatedAt")?,
        run_at: row.try_get("RunAt")?,
        attempts: row.try_get("Attempts")?,
        lock_token: row.try_get::<Option<Uuid>, _>("LockToken")?.map(LeaseToken),
        locked_until: row.try_get("LockedUntil")?,
        processed_at: row.try_get("ProcessedAt")?,
        dead_lettered_at: row.try_get("DeadLetteredAt")?,
        last_error: row.try_get("LastError")?,
        user_id: row.try_get("UserId")?,
        roles: Context::parse_roles(roles.as_deref()),
        tenant_id: row.try_get("TenantId")?,
        correlation_id: row.try_get("CorrelationId")?,
    })
}

fn lease_arrays(leases: &[Lease]) -> (Vec<Uuid>, Vec<Uuid>) {
    leases.iter().map(|l| (l.id.0, l.token.0)).unzip()
}

impl PgDriver {
    /// Connects a pool to `url` for `table`.
    pub async fn connect(url: &str, table: &TableName, options: &ConnectOptions) -> Result<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .connect(url)
            .await
            .map_err(Error::db(format!("connecting to {}", redact_url(url))))?;
        let t = table.quoted(Engine::Postgres);
        Ok(PgDriver {
            pool,
            table: table.clone(),
            sql: Sql::new(&t),
            t,
            url: url.to_owned(),
            listener: std::sync::Mutex::new(None),
        })
    }

    /// The pool, for callers that want to run their own transactions.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn ctx(&self, what: &str) -> String {
        format!("{what} ({})", self.table)
    }
}

#[async_trait]
impl QueueOps for PgDriver {
    fn engine(&self) -> Engine {
        Engine::Postgres
    }

    fn table(&self) -> &TableName {
        &self.table
    }

    async fn table_exists(&self) -> Result<bool> {
        let found: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
            .bind(&self.t)
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("looking up the commands table")))?;
        Ok(found.is_some())
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
        for chunk in commands.chunks(INSERT_CHUNK) {
            let mut cols: (Vec<Uuid>, Vec<String>, Vec<String>) = Default::default();
            let mut at = Vec::with_capacity(chunk.len());
            let mut delay = Vec::with_capacity(chunk.len());
            let mut ctx: [Vec<Option<String>>; 4] = Default::default();
            for command in chunk {
                command.validate()?;
                let (a, d) = run_at_parts(command.run_at);
                cols.0.push(command.id.0);
                cols.1.push(command.type_name.clone());
                cols.2.push(command.payload.to_string());
                at.push(a);
                delay.push(d);
                ctx[0].push(command.context.user_id.clone());
                ctx[1].push(command.context.roles_json());
                ctx[2].push(command.context.tenant_id.clone());
                ctx[3].push(command.context.correlation_id.clone());
                ids.push(command.id);
            }
            let [user, roles, tenant, correlation] = ctx;
            sqlx::query(AssertSqlSafe(self.sql.insert_many.clone()))
                .bind(cols.0)
                .bind(cols.1)
                .bind(cols.2)
                .bind(at)
                .bind(delay)
                .bind(user)
                .bind(roles)
                .bind(tenant)
                .bind(correlation)
                .execute(&self.pool)
                .await
                .map_err(Error::db(self.ctx("scheduling commands in bulk")))?;
        }
        Ok(ids)
    }

    async fn command_claim(&self, params: &ClaimParams) -> Result<Vec<CommandRow>> {
        let rows = sqlx::query(AssertSqlSafe(self.sql.claim.clone()))
            .bind(i64::from(params.limit))
            .bind(params.token.0)
            .bind(params.processing_delay.as_secs_f64())
            .bind(params.lease.as_secs_f64())
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(self.ctx("claiming due commands")))?;
        rows.iter()
            .map(|row| decode_row(row).map_err(Error::db(self.ctx("decoding a claimed row"))))
            .collect()
    }

    async fn command_get(&self, id: CommandId) -> Result<Option<CommandRow>> {
        let sql = format!(r#"SELECT * FROM {} WHERE "Id" = $1"#, self.t);
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db(self.ctx("reading a command")))?;
        row.as_ref()
            .map(|r| decode_row(r).map_err(Error::db(self.ctx("decoding a command"))))
            .transpose()
    }

    async fn command_complete_many(&self, leases: &[Lease]) -> Result<u64> {
        let (ids, tokens) = lease_arrays(leases);
        let done = sqlx::query(AssertSqlSafe(self.sql.complete.clone()))
            .bind(ids)
            .bind(tokens)
            .execute(&self.pool)
            .await
            .map_err(Error::db(self.ctx("stamping completed commands")))?;
        Ok(done.rows_affected())
    }

    async fn command_fail_many(&self, failures: &[Failure]) -> Result<u64> {
        let mut ids = Vec::with_capacity(failures.len());
        let mut tokens = Vec::with_capacity(failures.len());
        let mut errors = Vec::with_capacity(failures.len());
        let mut delays = Vec::with_capacity(failures.len());
        let mut dead = Vec::with_capacity(failures.len());
        for f in failures {
            ids.push(f.lease.id.0);
            tokens.push(f.lease.token.0);
            errors.push(f.error.replace('\0', ""));
            delays.push(f.retry_in.map_or(0.0, |d| d.as_secs_f64()));
            dead.push(f.retry_in.is_none());
        }
        let done = sqlx::query(AssertSqlSafe(self.sql.fail.clone()))
            .bind(ids)
            .bind(tokens)
            .bind(errors)
            .bind(delays)
            .bind(dead)
            .execute(&self.pool)
            .await
            .map_err(Error::db(self.ctx("stamping failed commands")))?;
        Ok(done.rows_affected())
    }

    async fn command_release_many(&self, leases: &[Lease]) -> Result<u64> {
        let (ids, tokens) = lease_arrays(leases);
        let done = sqlx::query(AssertSqlSafe(self.sql.release.clone()))
            .bind(ids)
            .bind(tokens)
            .execute(&self.pool)
            .await
            .map_err(Error::db(self.ctx("releasing leases")))?;
        Ok(done.rows_affected())
    }

    async fn completed_delete_batch(&self, older_than: Duration, limit: u32) -> Result<u64> {
        let done = sqlx::query(AssertSqlSafe(self.sql.sweep.clone()))
            .bind(older_than.as_secs_f64())
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

    async fn listen(&self, notify: Arc<Notify>) -> Result<bool> {
        let channel = crate::schema::notify_channel(&self.table);
        let mut listener = PgListener::connect(&self.url)
            .await
            .map_err(Error::db(self.ctx("opening the LISTEN connection")))?;
        listener
            .listen(&channel)
            .await
            .map_err(Error::db(self.ctx("subscribing to insert notifications")))?;
        let table = self.table.to_string();
        let task = tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    Ok(_) => notify.notify_one(),
                    Err(err) => {
                        tracing::warn!(table, error = %err, "LISTEN connection lost; reconnecting");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        // Anything committed while disconnected is found by this wake-up's claim.
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
        Ok(true)
    }

    async fn close(&self) {
        if let Ok(mut slot) = self.listener.lock()
            && let Some(task) = slot.take()
        {
            task.abort();
        }
        self.pool.close().await;
    }
}
