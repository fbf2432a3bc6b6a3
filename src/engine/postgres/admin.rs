//! PostgreSQL operator queries.
//!
//! Counts are one pass with `count(*) FILTER (…)`; bulk requeues and deletes pick a batch
//! of ids through the partial indexes (`IX_<table>_DeadLetters`, `IX_<table>_Retention`)
//! and touch those rows by primary key in the same statement. A requeue ends with a
//! `pg_notify` on the table's channel so idle processors pick the rows up at once.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use super::{BEGIN, PgDriver, decode_row};
use crate::command::{CommandId, CommandRow};
use crate::engine::admin::numbered_list_sql;
use crate::engine::admin::{
    CANCELLED, CancelledRow, CommandCancelManyParams, CommandListParams, ListState,
};
use crate::engine::admin::{
    CommandGetManyParams, CommandRequeueDeadManyParams, CommandRequeueManyParams, DeadLetterFilter,
    DeadLetterKey, DeadLetterListParams, DeadLetterPageParams, DeadLetterSummary,
    FinishedDeleteBatchParams, FinishedFilter, FinishedKind, KeyConflict, OrderKeyHolderParams,
    StateCount, StateCountParams, UniqueKeyHolder, UniqueKeyHoldersParams,
};
use crate::engine::admin::{CommandHead, CommandHeadParams, RequeueBatch, requeue_page};
use crate::engine::admin::{
    count_grouping, decode_state_count, is_unique_violation, requeue_dead_around_taken_keys,
};
use crate::engine::{AdminOps, Lifecycle};
use crate::error::{Error, Result};

/// The columns of a version-1 row but its payload, for a read that cuts the payload.
const COLUMNS_BUT_PAYLOAD: &str = r#""Id", "Type", "CreatedAt", "RunAt", "Attempts", "LockToken", "LockedUntil", "ProcessedAt", "DeadLetteredAt", "LastError", "UserId", "Roles", "TenantId", "CorrelationId""#;
/// The columns a version-2 table adds.
const COLUMNS_V2: &str = r#""Queue", "Priority", "UniqueKey", "TraceParent", "Snoozes""#;
/// The columns schema version 4 adds.
const COLUMNS_V4: &str = r#""ConcurrencyKey", "OrderKey", "Errors""#;

/// Pending: neither completed nor dead.
const PENDING: &str = r#""ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#;
/// No live lease.
const UNLEASED: &str = r#"("LockedUntil" IS NULL OR "LockedUntil" <= now())"#;
/// Dead: dead-lettered and not completed.
const DEAD: &str = r#""DeadLetteredAt" IS NOT NULL AND "ProcessedAt" IS NULL"#;
/// The assignments that put a row back to pending now (`LastError` is kept; on a
/// version-2 table the snooze count starts again too).
fn requeue_set(version: u32) -> &'static str {
    if version >= 2 {
        r#""RunAt" = now(), "Attempts" = 0, "DeadLetteredAt" = NULL,
           "LockToken" = NULL, "LockedUntil" = NULL, "Snoozes" = 0"#
    } else {
        r#""RunAt" = now(), "Attempts" = 0, "DeadLetteredAt" = NULL,
           "LockToken" = NULL, "LockedUntil" = NULL"#
    }
}

/// Dead letters at or before `$1`, of type `$2` when it is not NULL, of queue `$3` when
/// the filter names one.
fn dead_filter(filter: &DeadLetterFilter) -> String {
    let mut sql = r#""DeadLetteredAt" IS NOT NULL AND "ProcessedAt" IS NULL
                     AND "DeadLetteredAt" <= $1 AND ($2::text IS NULL OR "Type" = $2)"#
        .to_owned();
    if filter.queue.is_some() {
        sql.push_str(r#" AND "Queue" = $3"#);
    }
    sql
}

/// A dead letter `c` whose unique key no pending row holds.
fn key_free(t: &str, version: u32) -> String {
    if version < 2 {
        return String::new();
    }
    format!(
        r#" AND (c."UniqueKey" IS NULL OR NOT EXISTS (
               SELECT 1 FROM {t} p WHERE p."UniqueKey" = c."UniqueKey"
               AND p."ProcessedAt" IS NULL AND p."DeadLetteredAt" IS NULL))"#
    )
}

/// The `WHERE` condition and ordering column of finished rows at or before `$1` (then
/// of queue `$2` and of type `$n` when the filter names them, in that order), and the
/// number of the next free parameter.
fn finished(filter: &FinishedFilter) -> (String, &'static str, usize) {
    let mut extra = String::new();
    let mut next = 2;
    if filter.queue.is_some() {
        extra.push_str(&format!(r#" AND "Queue" = ${next}"#));
        next += 1;
    }
    if filter.type_name.is_some() {
        extra.push_str(&format!(r#" AND "Type" = ${next}"#));
        next += 1;
    }
    let (condition, order) = match filter.kind {
        FinishedKind::Completed => (
            format!(r#""ProcessedAt" IS NOT NULL AND "ProcessedAt" <= $1{extra}"#),
            r#""ProcessedAt""#,
        ),
        FinishedKind::DeadLetters => (
            format!(
                r#""DeadLetteredAt" IS NOT NULL AND "ProcessedAt" IS NULL AND "DeadLetteredAt" <= $1{extra}"#
            ),
            r#""DeadLetteredAt""#,
        ),
    };
    (condition, order, next)
}

/// The condition that selects a listing's rows.
fn list_condition(state: ListState) -> String {
    match state {
        ListState::Pending => PENDING.to_owned(),
        ListState::Due => {
            format!(r#"{PENDING} AND {UNLEASED} AND ("RunAt" <= now() OR "RunAt" IS NULL)"#)
        }
        ListState::Scheduled => format!(r#"{PENDING} AND {UNLEASED} AND "RunAt" > now()"#),
        ListState::Running => format!(r#"{PENDING} AND "LockedUntil" > now()"#),
        ListState::Dead => DEAD.to_owned(),
        ListState::Completed => r#""ProcessedAt" IS NOT NULL"#.to_owned(),
    }
}

impl PgDriver {
    /// What reads that may meet completed rows select `FROM`: the table, or on version 3
    /// the table and its history as one (`UNION ALL`: a condition on the whole is pushed
    /// into both branches, each of which uses its own indexes).
    pub(super) async fn all_rows(&self) -> Result<String> {
        let version = self.schema_version().await?;
        if version < 3 {
            return Ok(self.t.clone());
        }
        Ok(crate::engine::with_history(
            crate::ident::Engine::Postgres,
            &self.t,
            &self.h,
            version,
        ))
    }

    /// Puts back the listed rows that are still dead, in one statement.
    async fn requeue_dead(&self, set: &str, ids: &[Uuid]) -> std::result::Result<u64, sqlx::Error> {
        let t = &self.t;
        let sql = format!(r#"UPDATE {t} SET {set} WHERE "Id" = ANY($1) AND {DEAD}"#);
        Ok(
            on_pool!(self, self.pool, BEGIN, |e| sqlx::query(AssertSqlSafe(sql))
                .bind(ids)
                .execute(e))
            .await?
            .rows_affected(),
        )
    }

    /// Wakes idle processors listening on this table's channel.
    async fn notify_waiters(&self) -> Result<()> {
        on_pool!(self, self.pool, BEGIN, |e| sqlx::query(
            "SELECT pg_notify($1, '')"
        )
        .bind(self.table.notify_channel())
        .execute(e))
        .await
        .map_err(Error::db(
            self.ctx("notifying processors of requeued commands"),
        ))?;
        Ok(())
    }
}

#[async_trait]
impl AdminOps for PgDriver {
    fn id_problem(&self, id: &crate::command::CommandId) -> Option<String> {
        id.as_uuid().is_none().then(|| {
            "ids in a PostgreSQL table are UUIDs, like 0b5e3c1e-8f0a-4c1e-9d0e-2f3a4b5c6d7e"
                .to_owned()
        })
    }

    async fn clock_now(&self) -> Result<DateTime<Utc>> {
        on_pool!(self, self.pool, BEGIN, |e| sqlx::query_scalar(
            "SELECT now()"
        )
        .fetch_one(e))
        .await
        .map_err(self.db("reading the database clock"))
    }

    async fn state_count(&self, params: &StateCountParams) -> Result<Vec<StateCount>> {
        let t = &self.all_rows().await?;
        let version = self.schema_version().await?;
        let (select, group) = count_grouping(params, version, |c| format!(r#""{c}""#));
        let filter = if params.queue.is_some() {
            r#"WHERE "Queue" = $1"#
        } else {
            ""
        };
        let sql = format!(
            r#"SELECT {select}
                   count(*) FILTER (WHERE {PENDING} AND {UNLEASED} AND ("RunAt" <= now() OR "RunAt" IS NULL)) AS due,
                   count(*) FILTER (WHERE {PENDING} AND {UNLEASED} AND "RunAt" > now()) AS scheduled,
                   count(*) FILTER (WHERE {PENDING} AND "LockedUntil" > now()) AS running,
                   count(*) FILTER (WHERE {DEAD}) AS dead,
                   count(*) FILTER (WHERE "ProcessedAt" IS NOT NULL) AS completed
               FROM {t} {filter} {group}"#
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        if let Some(queue) = &params.queue {
            query = query.bind(queue);
        }
        let rows = on_pool!(self, self.pool, BEGIN, |e| query.fetch_all(e))
            .await
            .map_err(self.db("counting commands by state"))?;
        rows.iter()
            .map(|row| decode_state_count(row, params))
            .collect()
    }

    async fn dead_letter_list(
        &self,
        params: &DeadLetterListParams,
    ) -> Result<Vec<DeadLetterSummary>> {
        let t = &self.t;
        let queue = if params.queue.is_some() {
            r#"AND "Queue" = $3"#
        } else {
            ""
        };
        let sql = format!(
            r#"SELECT * FROM {t}
               WHERE {DEAD} AND ($1::text IS NULL OR "Type" = $1) {queue}
               ORDER BY "DeadLetteredAt" DESC, "Id"
               LIMIT $2"#
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(&params.type_name)
            .bind(i64::from(params.limit));
        if let Some(queue) = &params.queue {
            query = query.bind(queue);
        }
        let rows = on_pool!(self, self.pool, BEGIN, |e| query.fetch_all(e))
            .await
            .map_err(self.db("listing dead letters"))?;
        rows.iter()
            .map(|row| decode_row(row).map(DeadLetterSummary::from))
            .collect::<std::result::Result<_, sqlx::Error>>()
            .map_err(self.db("decoding a dead letter"))
    }

    async fn command_head(&self, params: &CommandHeadParams<'_>) -> Result<Option<CommandHead>> {
        let Some(id) = params.id.as_uuid() else {
            return Ok(None);
        };
        let t = &self.all_rows().await?;
        let version = self.schema_version().await?;
        let v2 = match version {
            4.. => format!(", {COLUMNS_V2}, {COLUMNS_V4}"),
            2..4 => format!(", {COLUMNS_V2}"),
            _ => String::new(),
        };
        let sql = format!(
            r#"SELECT {COLUMNS_BUT_PAYLOAD}{v2}, 'null'::jsonb AS "Payload",
                   left("Payload"::text, $2::int) AS "PayloadHead",
                   octet_length("Payload"::text)::bigint AS "PayloadBytes"
               FROM {t} WHERE "Id" = $1"#
        );
        let row = on_pool!(self, self.pool, BEGIN, |e| sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .bind(i64::from(params.max_chars))
            .fetch_optional(e))
        .await
        .map_err(self.db("reading a command"))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let decoded = decode_row(&row).map_err(self.db("decoding a command"))?;
        let head: Option<String> = row
            .try_get("PayloadHead")
            .map_err(self.db("decoding a command"))?;
        let bytes: Option<i64> = row
            .try_get("PayloadBytes")
            .map_err(self.db("decoding a command"))?;
        Ok(Some(CommandHead {
            row: decoded,
            payload_head: head.unwrap_or_default(),
            payload_bytes: bytes.unwrap_or(0).max(0) as u64,
        }))
    }

    async fn command_get_many(&self, params: &CommandGetManyParams<'_>) -> Result<Vec<CommandRow>> {
        let ids = params.ids;
        let t = &self.all_rows().await?;
        let ids: Vec<Uuid> = ids.iter().filter_map(CommandId::as_uuid).collect();
        let sql = format!(r#"SELECT * FROM {t} WHERE "Id" = ANY($1) ORDER BY "CreatedAt", "Id""#);
        let rows = on_pool!(self, self.pool, BEGIN, |e| sqlx::query(AssertSqlSafe(sql))
            .bind(ids)
            .fetch_all(e))
        .await
        .map_err(self.db("reading commands"))?;
        rows.iter()
            .map(|row| decode_row(row).map_err(self.db("decoding a command")))
            .collect()
    }

    async fn command_list(&self, params: &CommandListParams) -> Result<Vec<CommandRow>> {
        let after = params.after.as_ref().map(|id| id.as_uuid());
        if after == Some(None) {
            // Not a UUID: no such row here, so nothing follows it.
            return Ok(Vec::new());
        }
        let by_priority = params.state.claim_order() && self.schema_version().await? >= 2;
        let rows = if params.state == ListState::Completed {
            self.all_rows().await?
        } else {
            self.t.clone()
        };
        let sql = numbered_list_sql(
            &rows,
            params,
            list_condition(params.state),
            '$',
            by_priority,
        );
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(i64::from(params.limit));
        if let Some(type_name) = &params.type_name {
            query = query.bind(type_name);
        }
        if let Some(queue) = &params.queue {
            query = query.bind(queue);
        }
        if let Some(before) = params.before {
            query = query.bind(before);
        }
        if let Some(after) = after.flatten() {
            query = query.bind(after);
        }
        let rows = on_pool!(self, self.pool, BEGIN, |e| query.fetch_all(e))
            .await
            .map_err(self.db("listing commands"))?;
        rows.iter()
            .map(|row| decode_row(row).map_err(self.db("decoding a command")))
            .collect()
    }

    async fn command_cancel_many(
        &self,
        params: &CommandCancelManyParams,
    ) -> Result<Vec<CancelledRow>> {
        let t = &self.t;
        let ctx = || self.ctx("cancelling commands");
        let ids: Vec<Uuid> = params.ids.iter().filter_map(CommandId::as_uuid).collect();
        let unleased = if params.running {
            String::new()
        } else {
            format!("AND {UNLEASED}")
        };
        // The rows are locked first, so `running` is read from the row the update changes.
        let sql = format!(
            r#"WITH target AS (
                   SELECT "Id", COALESCE("LockedUntil" > now(), false) AS running FROM {t}
                   WHERE "Id" = ANY($1) AND {PENDING} {unleased}
                   FOR UPDATE)
               UPDATE {t} AS c SET "DeadLetteredAt" = now(), "LastError" = $2,
                                   "LockToken" = NULL, "LockedUntil" = NULL
               FROM target WHERE c."Id" = target."Id"
               RETURNING c."Id", target.running"#
        );
        let mut tx = self.pool.begin().await.map_err(Error::db(ctx()))?;
        let rows: Vec<(Uuid, bool)> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(&ids)
            .bind(CANCELLED)
            .fetch_all(&mut *tx)
            .await
            .map_err(Error::db(ctx()))?;
        if rows.iter().any(|(_, running)| *running) {
            // Delivered at commit: the processor running one checks its leases at once.
            sqlx::query("SELECT pg_notify($1, '')")
                .bind(self.table.cancel_channel())
                .execute(&mut *tx)
                .await
                .map_err(Error::db(ctx()))?;
        }
        tx.commit().await.map_err(Error::db(ctx()))?;
        Ok(rows
            .into_iter()
            .map(|(id, was_running)| CancelledRow {
                id: CommandId::from(id),
                was_running,
            })
            .collect())
    }

    async fn order_key_holder(&self, params: &OrderKeyHolderParams) -> Result<Option<CommandId>> {
        let Some(id) = params.id.as_uuid() else {
            return Ok(None);
        };
        if self.schema_version().await? < 4 {
            return Ok(None);
        }
        let t = &self.t;
        let sql = format!(
            r#"SELECT o."Id" FROM {t} AS c JOIN {t} AS o ON o."OrderKey" = c."OrderKey"
               WHERE c."Id" = $1 AND o."ProcessedAt" IS NULL AND o."DeadLetteredAt" IS NULL
                 AND (o."CreatedAt", o."Id") < (c."CreatedAt", c."Id")
               ORDER BY o."CreatedAt", o."Id" LIMIT 1"#
        );
        let holder: Option<Uuid> = on_pool!(self, self.pool, BEGIN, |e| sqlx::query_scalar(
            AssertSqlSafe(sql)
        )
        .bind(id)
        .fetch_optional(e))
        .await
        .map_err(self.db("looking up the row an order key waits behind"))?;
        Ok(holder.map(CommandId::from))
    }

    async fn unique_key_holders(
        &self,
        params: &UniqueKeyHoldersParams,
    ) -> Result<Vec<UniqueKeyHolder>> {
        if params.keys.is_empty() || self.schema_version().await? < 2 {
            return Ok(Vec::new());
        }
        let t = &self.t;
        let sql = format!(
            r#"SELECT "UniqueKey", "Id" FROM {t}
               WHERE "UniqueKey" = ANY($1) AND {PENDING}"#
        );
        let rows: Vec<(String, Uuid)> = on_pool!(self, self.pool, BEGIN, |e| sqlx::query_as(
            AssertSqlSafe(sql)
        )
        .bind(&params.keys)
        .fetch_all(e))
        .await
        .map_err(self.db("looking up unique keys"))?;
        Ok(rows
            .into_iter()
            .map(|(unique_key, id)| UniqueKeyHolder {
                unique_key,
                id: CommandId::from(id),
            })
            .collect())
    }

    async fn command_requeue_many(&self, params: &CommandRequeueManyParams) -> Result<u64> {
        let t = &self.t;
        let ctx = || self.ctx("requeueing commands");
        // An id that is not a UUID cannot exist here; counting it keeps all-or-nothing.
        let ids: Vec<Uuid> = params.ids.iter().filter_map(CommandId::as_uuid).collect();
        if ids.len() != params.ids.len() {
            return Ok(0);
        }
        let set = requeue_set(self.schema_version().await?);
        let sql = format!(
            r#"UPDATE {t} SET {set}
               WHERE "Id" = ANY($1) AND "ProcessedAt" IS NULL AND {UNLEASED}"#
        );
        let mut tx = self.pool.begin().await.map_err(Error::db(ctx()))?;
        let done = match sqlx::query(AssertSqlSafe(sql))
            .bind(&ids)
            .execute(&mut *tx)
            .await
        {
            Ok(done) => done.rows_affected(),
            // A row made pending meanwhile holds a key being put back: nothing changes,
            // as for any row that changed state.
            Err(err) if is_unique_violation(&err) => return Ok(0),
            Err(err) => return Err(Error::db(ctx())(err)),
        };
        if done != ids.len() as u64 {
            tx.rollback().await.map_err(Error::db(ctx()))?;
            return Ok(0);
        }
        tx.commit().await.map_err(Error::db(ctx()))?;
        if done > 0 {
            self.notify_waiters().await?;
        }
        Ok(done)
    }

    async fn dead_letter_count(&self, filter: &DeadLetterFilter) -> Result<u64> {
        let t = &self.t;
        let sql = format!("SELECT count(*) FROM {t} WHERE {}", dead_filter(filter));
        let mut query = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(filter.dead_before)
            .bind(&filter.type_name);
        if let Some(queue) = &filter.queue {
            query = query.bind(queue);
        }
        let n: i64 = on_pool!(self, self.pool, BEGIN, |e| query.fetch_one(e))
            .await
            .map_err(self.db("counting dead letters"))?;
        Ok(n.max(0) as u64)
    }

    async fn dead_letter_page(&self, params: &DeadLetterPageParams) -> Result<Vec<DeadLetterKey>> {
        let t = &self.t;
        let version = self.schema_version().await?;
        let (key, free) = if version >= 2 {
            (r#"c."UniqueKey""#, key_free(t, version))
        } else {
            ("NULL::text", String::new())
        };
        let limit = if params.filter.queue.is_some() {
            "$4"
        } else {
            "$3"
        };
        let sql = format!(
            r#"SELECT c."Id", {key} FROM {t} AS c WHERE {} {free}
               ORDER BY c."DeadLetteredAt" LIMIT {limit}"#,
            dead_filter(&params.filter)
        );
        let mut query = sqlx::query_as(AssertSqlSafe(sql))
            .bind(params.filter.dead_before)
            .bind(&params.filter.type_name);
        if let Some(queue) = &params.filter.queue {
            query = query.bind(queue);
        }
        let rows: Vec<(Uuid, Option<String>)> = on_pool!(self, self.pool, BEGIN, |e| query
            .bind(i64::from(params.limit))
            .fetch_all(e))
        .await
        .map_err(self.db("reading dead letters to requeue"))?;
        Ok(rows
            .into_iter()
            .map(|(id, unique_key)| DeadLetterKey {
                id: CommandId::from(id),
                unique_key,
            })
            .collect())
    }

    async fn command_requeue_dead_many(
        &self,
        params: &CommandRequeueDeadManyParams,
    ) -> Result<u64> {
        let ctx = || self.ctx("requeueing dead letters");
        let ids: Vec<Uuid> = params.ids.iter().filter_map(CommandId::as_uuid).collect();
        let set = requeue_set(self.schema_version().await?);
        let requeue = |ids| self.requeue_dead(set, ids);
        let done = requeue_dead_around_taken_keys(&ids, requeue, ctx).await?;
        if done > 0 {
            self.notify_waiters().await?;
        }
        Ok(done)
    }

    async fn dead_letter_requeue_batch(
        &self,
        params: &DeadLetterPageParams,
    ) -> Result<RequeueBatch> {
        // One statement: the page (locked), the first row of each key and every row
        // without one, the update.
        let t = &self.t;
        let version = self.schema_version().await?;
        let (key, free) = if version >= 2 {
            (r#"c."UniqueKey""#, key_free(t, version))
        } else {
            ("NULL::text", String::new())
        };
        let limit = if params.filter.queue.is_some() {
            "$4"
        } else {
            "$3"
        };
        let set = requeue_set(version);
        let sql = format!(
            r#"WITH page AS (
                   SELECT c."Id", {key} AS "UniqueKey", c."DeadLetteredAt" FROM {t} AS c
                   WHERE {} {free}
                   ORDER BY c."DeadLetteredAt" LIMIT {limit}
                   FOR UPDATE),
               pick AS (
                   SELECT "Id" FROM page WHERE "UniqueKey" IS NULL
                   UNION ALL
                   (SELECT DISTINCT ON ("UniqueKey") "Id" FROM page WHERE "UniqueKey" IS NOT NULL
                    ORDER BY "UniqueKey", "DeadLetteredAt")),
               done AS (
                   UPDATE {t} AS u SET {set} FROM pick WHERE u."Id" = pick."Id" RETURNING 1)
               SELECT (SELECT count(*) FROM page), (SELECT count(*) FROM done)"#,
            dead_filter(&params.filter)
        );
        let mut query = sqlx::query_as(AssertSqlSafe(sql))
            .bind(params.filter.dead_before)
            .bind(&params.filter.type_name);
        if let Some(queue) = &params.filter.queue {
            query = query.bind(queue);
        }
        let outcome: std::result::Result<(i64, i64), sqlx::Error> =
            on_pool!(self, self.pool, BEGIN, |e| query
                .bind(i64::from(params.limit))
                .fetch_one(e))
            .await;
        let (selected, requeued) = match outcome {
            Ok(counts) => counts,
            // Another writer took a key meanwhile: this batch in two steps, row by row
            // where a key is taken.
            Err(err) if is_unique_violation(&err) => return requeue_page(self, params).await,
            Err(err) => return Err(Error::db(self.ctx("requeueing dead letters"))(err)),
        };
        if requeued > 0 {
            self.notify_waiters().await?;
        }
        Ok(RequeueBatch {
            selected: selected.max(0) as u64,
            requeued: requeued.max(0) as u64,
        })
    }

    async fn dead_letter_key_conflicts(
        &self,
        params: &DeadLetterPageParams,
    ) -> Result<Vec<KeyConflict>> {
        if self.schema_version().await? < 2 {
            return Ok(Vec::new());
        }
        let t = &self.t;
        let limit = if params.filter.queue.is_some() {
            "$4"
        } else {
            "$3"
        };
        let sql = format!(
            r#"SELECT c."Id", c."UniqueKey", p."Id" FROM {t} AS c
               JOIN {t} AS p ON p."UniqueKey" = c."UniqueKey"
                    AND p."ProcessedAt" IS NULL AND p."DeadLetteredAt" IS NULL
               WHERE {}
               ORDER BY c."DeadLetteredAt", c."Id" LIMIT {limit}"#,
            dead_filter(&params.filter)
                .replace(r#""DeadLetteredAt""#, r#"c."DeadLetteredAt""#)
                .replace(r#""ProcessedAt""#, r#"c."ProcessedAt""#)
                .replace(r#""Type""#, r#"c."Type""#)
                .replace(r#""Queue""#, r#"c."Queue""#)
        );
        let mut query = sqlx::query_as(AssertSqlSafe(sql))
            .bind(params.filter.dead_before)
            .bind(&params.filter.type_name);
        if let Some(queue) = &params.filter.queue {
            query = query.bind(queue);
        }
        let rows: Vec<(Uuid, String, Uuid)> = on_pool!(self, self.pool, BEGIN, |e| query
            .bind(i64::from(params.limit))
            .fetch_all(e))
        .await
        .map_err(self.db("reading dead letters whose unique key is taken"))?;
        Ok(rows
            .into_iter()
            .map(|(id, unique_key, held_by)| KeyConflict {
                id: CommandId::from(id),
                unique_key,
                held_by: CommandId::from(held_by),
            })
            .collect())
    }

    async fn finished_count(&self, filter: &FinishedFilter) -> Result<u64> {
        let t = &match filter.kind {
            FinishedKind::Completed => self.all_rows().await?,
            FinishedKind::DeadLetters => self.t.clone(),
        };
        let (condition, _, _) = finished(filter);
        let sql = format!("SELECT count(*) FROM {t} WHERE {condition}");
        let mut query = sqlx::query_scalar(AssertSqlSafe(sql)).bind(filter.before);
        if let Some(queue) = &filter.queue {
            query = query.bind(queue);
        }
        if let Some(type_name) = &filter.type_name {
            query = query.bind(type_name);
        }
        let n: i64 = on_pool!(self, self.pool, BEGIN, |e| query.fetch_one(e))
            .await
            .map_err(self.db("counting finished commands"))?;
        Ok(n.max(0) as u64)
    }

    async fn finished_delete_batch(&self, params: &FinishedDeleteBatchParams) -> Result<u64> {
        let from_history =
            params.filter.kind == FinishedKind::Completed && self.schema_version().await? >= 3;
        let mut done = 0;
        if from_history {
            done = self
                .finished_delete_from(&self.h, params, params.limit)
                .await?;
        }
        let left = params.limit.saturating_sub(done as u32);
        if left > 0 {
            done += self.finished_delete_from(&self.t, params, left).await?;
        }
        Ok(done)
    }
}

impl PgDriver {
    /// Deletes up to `limit` finished rows of `params`' filter from `t` (the table or its
    /// history), oldest first, by primary key.
    async fn finished_delete_from(
        &self,
        t: &str,
        params: &FinishedDeleteBatchParams,
        limit: u32,
    ) -> Result<u64> {
        let (condition, order, limit_mark) = finished(&params.filter);
        let limit_value = limit;
        let limit = limit_mark;
        let sql = format!(
            r#"DELETE FROM {t} WHERE "Id" IN (
                   SELECT "Id" FROM {t} WHERE {condition} ORDER BY {order} LIMIT ${limit})"#
        );
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(params.filter.before);
        if let Some(queue) = &params.filter.queue {
            query = query.bind(queue);
        }
        if let Some(type_name) = &params.filter.type_name {
            query = query.bind(type_name);
        }
        let done = on_pool!(self, self.pool, BEGIN, |e| query
            .bind(i64::from(limit_value))
            .execute(e))
        .await
        .map_err(self.db("purging finished commands"))?;
        Ok(done.rows_affected())
    }
}
