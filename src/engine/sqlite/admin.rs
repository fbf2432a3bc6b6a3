//! SQLite operator queries.
//!
//! Timestamps are compared as text in icq's fixed UTC format (text order is time order),
//! so cutoffs are bound as [`format_timestamp`] strings. Bulk requeues and deletes pick a
//! batch of ids in a subquery and touch those rows by primary key in the same statement;
//! each statement is its own short write transaction, so the processor's writes
//! interleave with a long purge instead of waiting behind it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Row};

use super::{NOW, SqliteDriver, decode_row};
use crate::command::{CommandId, CommandRow, format_timestamp, parse_timestamp};
use crate::engine::admin::numbered_list_sql;
use crate::engine::admin::{
    CANCELLED, CancelledRow, CommandCancelManyParams, CommandListParams, ListState,
};
use crate::engine::admin::{
    CommandGetManyParams, CommandRequeueDeadManyParams, CommandRequeueManyParams, DeadLetterFilter,
    DeadLetterKey, DeadLetterListParams, DeadLetterPageParams, DeadLetterSummary,
    FinishedDeleteBatchParams, FinishedFilter, FinishedKind, KeyConflict, StateCount,
    StateCountParams, UniqueKeyHolder, UniqueKeyHoldersParams,
};
use crate::engine::admin::{CommandHead, CommandHeadParams};
use crate::engine::admin::{
    count_grouping, decode_state_count, is_unique_violation, requeue_dead_around_taken_keys,
};
use crate::engine::{AdminOps, Lifecycle, marks};
use crate::error::{Error, Result};

/// Ids per `IN (…)` list, well under SQLite's bound-parameter limit.
const IDS_PER_STATEMENT: usize = 500;

/// Pending: neither completed nor dead.
const PENDING: &str = r#""ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#;
/// Dead: dead-lettered and not completed.
const DEAD: &str = r#""DeadLetteredAt" IS NOT NULL AND "ProcessedAt" IS NULL"#;

/// Dead letters at or before `?1`, of type `?2` when it is not NULL, of queue `?3` when
/// the filter names one; `c` is the table's alias.
fn dead_filter(filter: &DeadLetterFilter) -> String {
    let mut sql = r#"c."DeadLetteredAt" IS NOT NULL AND c."ProcessedAt" IS NULL
                     AND c."DeadLetteredAt" <= ?1 AND (?2 IS NULL OR c."Type" = ?2)"#
        .to_owned();
    if filter.queue.is_some() {
        sql.push_str(r#" AND c."Queue" = ?3"#);
    }
    sql
}

/// Binds a dead-letter filter's values in the order [`dead_filter`] numbers them.
fn bind_dead_filter<'q, O>(
    query: sqlx::query::QueryAs<'q, sqlx::Sqlite, O, sqlx::sqlite::SqliteArguments>,
    filter: &'q DeadLetterFilter,
) -> sqlx::query::QueryAs<'q, sqlx::Sqlite, O, sqlx::sqlite::SqliteArguments> {
    let query = query
        .bind(format_timestamp(filter.dead_before))
        .bind(&filter.type_name);
    match &filter.queue {
        Some(queue) => query.bind(queue),
        None => query,
    }
}

/// The limit's placeholder after a dead-letter filter's.
fn limit_after(filter: &DeadLetterFilter) -> &'static str {
    if filter.queue.is_some() { "?4" } else { "?3" }
}

/// No live lease.
fn unleased() -> String {
    format!(r#"("LockedUntil" IS NULL OR "LockedUntil" <= {NOW})"#)
}

/// The assignments that put a row back to pending now (`LastError` is kept; on a
/// version-2 table the snooze count starts again too).
fn requeue_set(version: u32) -> String {
    let snoozes = if version >= 2 {
        r#", "Snoozes" = 0"#
    } else {
        ""
    };
    format!(
        r#""RunAt" = {NOW}, "Attempts" = 0, "DeadLetteredAt" = NULL,
           "LockToken" = NULL, "LockedUntil" = NULL{snoozes}"#
    )
}

/// The `WHERE` condition and ordering column of finished rows at or before `?1` (then
/// of queue `?2` and of type `?n` when the filter names them, in that order), and the
/// number of the next free parameter.
fn finished(filter: &FinishedFilter) -> (String, &'static str, usize) {
    let mut extra = String::new();
    let mut next = 2;
    if filter.queue.is_some() {
        extra.push_str(&format!(r#" AND "Queue" = ?{next}"#));
        next += 1;
    }
    if filter.type_name.is_some() {
        extra.push_str(&format!(r#" AND "Type" = ?{next}"#));
        next += 1;
    }
    let (condition, order) = match filter.kind {
        FinishedKind::Completed => (
            format!(r#""ProcessedAt" IS NOT NULL AND "ProcessedAt" <= ?1{extra}"#),
            r#""ProcessedAt""#,
        ),
        FinishedKind::DeadLetters => (
            format!(
                r#""DeadLetteredAt" IS NOT NULL AND "ProcessedAt" IS NULL AND "DeadLetteredAt" <= ?1{extra}"#
            ),
            r#""DeadLetteredAt""#,
        ),
    };
    (condition, order, next)
}

/// The condition that selects a listing's rows. A `RunAt` that is not a time (text
/// after the digits, `'tomorrow'`) counts as due, as the claim and the counts take it.
fn list_condition(state: ListState) -> String {
    let unleased = unleased();
    match state {
        ListState::Pending => PENDING.to_owned(),
        ListState::Due => {
            format!(
                r#"{PENDING} AND {unleased} AND ("RunAt" <= {NOW} OR "RunAt" >= ':' OR "RunAt" IS NULL)"#
            )
        }
        ListState::Scheduled => {
            format!(r#"{PENDING} AND {unleased} AND "RunAt" > {NOW} AND "RunAt" < ':'"#)
        }
        ListState::Running => format!(r#"{PENDING} AND "LockedUntil" > {NOW}"#),
        ListState::Dead => DEAD.to_owned(),
        ListState::Completed => r#""ProcessedAt" IS NOT NULL"#.to_owned(),
    }
}

impl SqliteDriver {
    /// Puts back the listed rows that are still dead, in one statement.
    async fn requeue_dead(
        &self,
        set: &str,
        ids: &[crate::command::CommandId],
    ) -> std::result::Result<u64, sqlx::Error> {
        let t = &self.t;
        let sql = format!(
            r#"UPDATE {t} SET {set} WHERE "Id" IN ({}) AND {DEAD}"#,
            marks(ids.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for id in ids {
            query = query.bind(id.to_string());
        }
        Ok(query.execute(&self.pool).await?.rows_affected())
    }
}

impl SqliteDriver {
    /// What reads that may meet completed rows select `FROM`: the table, or on version 3
    /// the table and its history as one (`UNION ALL`; SQLite pushes a condition on the
    /// whole into both branches, each of which uses its own indexes).
    pub(super) async fn all_rows(&self) -> Result<String> {
        let version = self.schema_version().await?;
        if version < 3 {
            return Ok(self.t.clone());
        }
        Ok(crate::engine::with_history(
            crate::ident::Engine::Sqlite,
            &self.t,
            &self.h,
            version,
        ))
    }

    /// Deletes up to `limit` finished rows of `params`' filter from `t` (the table or its
    /// history), oldest first, by primary key.
    async fn finished_delete_from(
        &self,
        t: &str,
        params: &FinishedDeleteBatchParams,
        limit: u32,
    ) -> Result<u64> {
        let (condition, order, limit_mark) = finished(&params.filter);
        let sql = format!(
            r#"DELETE FROM {t} WHERE "Id" IN (
                   SELECT "Id" FROM {t} WHERE {condition} ORDER BY {order} LIMIT ?{limit_mark})"#
        );
        let mut query =
            sqlx::query(AssertSqlSafe(sql)).bind(format_timestamp(params.filter.before));
        if let Some(queue) = &params.filter.queue {
            query = query.bind(queue);
        }
        if let Some(type_name) = &params.filter.type_name {
            query = query.bind(type_name);
        }
        let done = query
            .bind(i64::from(limit))
            .execute(&self.pool)
            .await
            .map_err(Error::db(self.ctx("purging finished commands")))?;
        Ok(done.rows_affected())
    }
}

#[async_trait]
impl AdminOps for SqliteDriver {
    async fn command_list(&self, params: &CommandListParams) -> Result<Vec<CommandRow>> {
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
            '?',
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
            query = query.bind(format_timestamp(before));
        }
        if let Some(after) = &params.after {
            query = query.bind(after.to_string());
        }
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(self.ctx("listing commands")))?;
        rows.iter()
            .map(|row| decode_row(row).map_err(Error::db(self.ctx("decoding a command"))))
            .collect()
    }

    async fn command_cancel_many(
        &self,
        params: &CommandCancelManyParams,
    ) -> Result<Vec<CancelledRow>> {
        let t = &self.t;
        let ctx = || self.ctx("cancelling commands");
        let unleased = if params.running {
            String::new()
        } else {
            format!("AND {}", unleased())
        };
        let mut cancelled = Vec::new();
        for chunk in params.ids.chunks(IDS_PER_STATEMENT) {
            let marks = marks(chunk.len());
            // One writer at a time: the running rows read here are the ones the update
            // changes (`RETURNING` has only the new, lease-less values).
            let mut tx = self
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(Error::db(ctx()))?;
            let select = format!(
                r#"SELECT CAST("Id" AS TEXT) FROM {t} WHERE "Id" IN ({marks}) AND {PENDING}
                   AND "LockedUntil" > {NOW} {unleased}"#
            );
            let mut query = sqlx::query_scalar::<_, String>(AssertSqlSafe(select));
            for id in chunk {
                query = query.bind(id.to_string());
            }
            let running: std::collections::HashSet<String> = query
                .fetch_all(&mut *tx)
                .await
                .map_err(Error::db(ctx()))?
                .into_iter()
                .collect();
            let update = format!(
                r#"UPDATE {t} SET "DeadLetteredAt" = {NOW}, "LastError" = ?,
                                  "LockToken" = NULL, "LockedUntil" = NULL
                   WHERE "Id" IN ({marks}) AND {PENDING} {unleased}
                   RETURNING CAST("Id" AS TEXT)"#
            );
            let mut query = sqlx::query_scalar::<_, String>(AssertSqlSafe(update)).bind(CANCELLED);
            for id in chunk {
                query = query.bind(id.to_string());
            }
            let done = query.fetch_all(&mut *tx).await.map_err(Error::db(ctx()))?;
            tx.commit().await.map_err(Error::db(ctx()))?;
            cancelled.extend(done.into_iter().map(|id| CancelledRow {
                was_running: running.contains(&id),
                id: CommandId::stored(id),
            }));
        }
        Ok(cancelled)
    }

    async fn order_key_holder(
        &self,
        params: &crate::engine::admin::OrderKeyHolderParams,
    ) -> Result<Option<CommandId>> {
        if self.schema_version().await? < 4 {
            return Ok(None);
        }
        let t = &self.t;
        let sql = format!(
            r#"SELECT o."Id" FROM {t} AS c JOIN {t} AS o ON o."OrderKey" = c."OrderKey"
               WHERE c."Id" = ?1 AND o."ProcessedAt" IS NULL AND o."DeadLetteredAt" IS NULL
                 AND (o."CreatedAt", o."Id") < (c."CreatedAt", c."Id")
               ORDER BY o."CreatedAt", o."Id" LIMIT 1"#
        );
        let holder: Option<String> = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(params.id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db(
                self.ctx("looking up the row an order key waits behind"),
            ))?;
        Ok(holder.map(CommandId::stored))
    }

    async fn unique_key_holders(
        &self,
        params: &UniqueKeyHoldersParams,
    ) -> Result<Vec<UniqueKeyHolder>> {
        if params.keys.is_empty() || self.schema_version().await? < 2 {
            return Ok(Vec::new());
        }
        let t = &self.t;
        let mut found = Vec::new();
        for chunk in params.keys.chunks(IDS_PER_STATEMENT) {
            let sql = format!(
                r#"SELECT "UniqueKey", "Id" FROM {t}
                   WHERE "UniqueKey" IN ({}) AND {PENDING}"#,
                marks(chunk.len())
            );
            let mut query = sqlx::query_as::<_, (String, String)>(AssertSqlSafe(sql));
            for key in chunk {
                query = query.bind(key);
            }
            let rows = query
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db(self.ctx("looking up unique keys")))?;
            found.extend(rows.into_iter().map(|(unique_key, id)| UniqueKeyHolder {
                unique_key,
                id: CommandId::stored(id),
            }));
        }
        Ok(found)
    }

    async fn clock_now(&self) -> Result<DateTime<Utc>> {
        let now: String = sqlx::query_scalar(AssertSqlSafe(format!("SELECT {NOW}")))
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("reading the database clock")))?;
        parse_timestamp(&now).ok_or_else(|| {
            Error::db(self.ctx("reading the database clock"))(sqlx::Error::Decode(
                format!("`{now}` is not a timestamp").into(),
            ))
        })
    }

    async fn state_count(&self, params: &StateCountParams) -> Result<Vec<StateCount>> {
        let t = &self.all_rows().await?;
        let unleased = unleased();
        let version = self.schema_version().await?;
        let (select, group) = count_grouping(params, version, |c| format!(r#""{c}""#));
        let filter = if params.queue.is_some() {
            r#"WHERE "Queue" = ?1"#
        } else {
            ""
        };
        let sql = format!(
            r#"SELECT {select}
                   COALESCE(SUM({PENDING} AND {unleased} AND ("RunAt" <= {NOW} OR "RunAt" >= ':' OR "RunAt" IS NULL)), 0) AS due,
                   COALESCE(SUM({PENDING} AND {unleased} AND "RunAt" > {NOW} AND "RunAt" < ':'), 0) AS scheduled,
                   COALESCE(SUM({PENDING} AND COALESCE("LockedUntil" > {NOW}, 0)), 0) AS running,
                   COALESCE(SUM({DEAD}), 0) AS dead,
                   COALESCE(SUM("ProcessedAt" IS NOT NULL), 0) AS completed
               FROM {t} {filter} {group}"#
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        if let Some(queue) = &params.queue {
            query = query.bind(queue);
        }
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting commands by state")))?;
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
            r#"AND "Queue" = ?3"#
        } else {
            ""
        };
        let columns = self.columns().await?;
        let sql = format!(
            r#"SELECT {columns} FROM {t}
               WHERE {DEAD} AND (?1 IS NULL OR "Type" = ?1) {queue}
               ORDER BY "DeadLetteredAt" DESC, "Id"
               LIMIT ?2"#
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(&params.type_name)
            .bind(i64::from(params.limit));
        if let Some(queue) = &params.queue {
            query = query.bind(queue);
        }
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(self.ctx("listing dead letters")))?;
        rows.iter()
            .map(|row| decode_row(row).map(DeadLetterSummary::from))
            .collect::<std::result::Result<_, _>>()
            .map_err(Error::db(self.ctx("decoding a dead letter")))
    }

    async fn command_head(&self, params: &CommandHeadParams<'_>) -> Result<Option<CommandHead>> {
        let t = &self.all_rows().await?;
        let columns = self.columns().await?;
        // `substr` of text counts characters; the length is the text's bytes.
        let columns = columns.replace(
            r#""Payload""#,
            r#"'null' AS "Payload",
               substr(CAST("Payload" AS TEXT), 1, ?2) AS "PayloadHead",
               length(CAST("Payload" AS BLOB)) AS "PayloadBytes""#,
        );
        let sql = format!(r#"SELECT {columns} FROM {t} WHERE "Id" = ?1"#);
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(params.id.to_string())
            .bind(i64::from(params.max_chars))
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db(self.ctx("reading a command")))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let ctx = || self.ctx("decoding a command");
        let decoded = decode_row(&row).map_err(Error::db(ctx()))?;
        let head: Option<String> = row.try_get("PayloadHead").map_err(Error::db(ctx()))?;
        let bytes: Option<i64> = row.try_get("PayloadBytes").map_err(Error::db(ctx()))?;
        Ok(Some(CommandHead {
            row: decoded,
            payload_head: head.unwrap_or_default(),
            payload_bytes: bytes.unwrap_or(0).max(0) as u64,
        }))
    }

    async fn command_get_many(&self, params: &CommandGetManyParams<'_>) -> Result<Vec<CommandRow>> {
        let ids = params.ids;
        let columns = self.columns().await?;
        let t = &self.all_rows().await?;
        let mut found = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(IDS_PER_STATEMENT) {
            let marks = marks(chunk.len());
            let sql = format!(
                r#"SELECT {columns} FROM {t} WHERE "Id" IN ({marks}) ORDER BY "CreatedAt", "Id""#
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for id in chunk {
                query = query.bind(id.to_string());
            }
            let rows = query
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db(self.ctx("reading commands")))?;
            for row in &rows {
                found.push(decode_row(row).map_err(Error::db(self.ctx("decoding a command")))?);
            }
        }
        Ok(found)
    }

    async fn command_requeue_many(&self, params: &CommandRequeueManyParams) -> Result<u64> {
        let t = &self.t;
        let ctx = || self.ctx("requeueing commands");
        let (set, unleased) = (requeue_set(self.schema_version().await?), unleased());
        let mut tx = self.pool.begin().await.map_err(Error::db(ctx()))?;
        let mut done = 0;
        for chunk in params.ids.chunks(IDS_PER_STATEMENT) {
            let marks = marks(chunk.len());
            let sql = format!(
                r#"UPDATE {t} SET {set}
                   WHERE "Id" IN ({marks}) AND "ProcessedAt" IS NULL AND {unleased}"#
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for id in chunk {
                query = query.bind(id.to_string());
            }
            done += match query.execute(&mut *tx).await {
                Ok(done) => done.rows_affected(),
                // A row made pending meanwhile holds a key being put back: nothing
                // changes, as for any row that changed state.
                Err(err) if is_unique_violation(&err) => return Ok(0),
                Err(err) => return Err(Error::db(ctx())(err)),
            };
        }
        if done != params.ids.len() as u64 {
            tx.rollback().await.map_err(Error::db(ctx()))?;
            return Ok(0);
        }
        tx.commit().await.map_err(Error::db(ctx()))?;
        Ok(done)
    }

    async fn dead_letter_count(&self, filter: &DeadLetterFilter) -> Result<u64> {
        let t = &self.t;
        let sql = format!(
            "SELECT COUNT(*) FROM {t} AS c WHERE {}",
            dead_filter(filter)
        );
        let (n,): (i64,) = bind_dead_filter(sqlx::query_as(AssertSqlSafe(sql)), filter)
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting dead letters")))?;
        Ok(n.max(0) as u64)
    }

    async fn dead_letter_page(&self, params: &DeadLetterPageParams) -> Result<Vec<DeadLetterKey>> {
        let t = &self.t;
        let version = self.schema_version().await?;
        let (key, free) = if version >= 2 {
            (
                r#"c."UniqueKey""#,
                format!(
                    r#" AND (c."UniqueKey" IS NULL OR NOT EXISTS (
                           SELECT 1 FROM {t} p WHERE p."UniqueKey" = c."UniqueKey"
                           AND p."ProcessedAt" IS NULL AND p."DeadLetteredAt" IS NULL))"#
                ),
            )
        } else {
            ("NULL", String::new())
        };
        let sql = format!(
            r#"SELECT c."Id", {key} FROM {t} AS c WHERE {} {free}
               ORDER BY c."DeadLetteredAt" LIMIT {}"#,
            dead_filter(&params.filter),
            limit_after(&params.filter)
        );
        let rows: Vec<(String, Option<String>)> =
            bind_dead_filter(sqlx::query_as(AssertSqlSafe(sql)), &params.filter)
                .bind(i64::from(params.limit))
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db(self.ctx("reading dead letters to requeue")))?;
        Ok(rows.into_iter().map(DeadLetterKey::from).collect())
    }

    async fn command_requeue_dead_many(
        &self,
        params: &CommandRequeueDeadManyParams,
    ) -> Result<u64> {
        let ctx = || self.ctx("requeueing dead letters");
        let set = requeue_set(self.schema_version().await?);
        let mut done = 0;
        for chunk in params.ids.chunks(IDS_PER_STATEMENT) {
            let requeue = |ids| self.requeue_dead(&set, ids);
            done += requeue_dead_around_taken_keys(chunk, requeue, ctx).await?;
        }
        Ok(done)
    }

    async fn dead_letter_key_conflicts(
        &self,
        params: &DeadLetterPageParams,
    ) -> Result<Vec<KeyConflict>> {
        if self.schema_version().await? < 2 {
            return Ok(Vec::new());
        }
        let t = &self.t;
        let sql = format!(
            r#"SELECT c."Id", c."UniqueKey", p."Id" FROM {t} AS c
               JOIN {t} AS p ON p."UniqueKey" = c."UniqueKey"
                    AND p."ProcessedAt" IS NULL AND p."DeadLetteredAt" IS NULL
               WHERE {}
               ORDER BY c."DeadLetteredAt", c."Id" LIMIT {}"#,
            dead_filter(&params.filter),
            limit_after(&params.filter)
        );
        let rows: Vec<(String, String, String)> =
            bind_dead_filter(sqlx::query_as(AssertSqlSafe(sql)), &params.filter)
                .bind(i64::from(params.limit))
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db(
                    self.ctx("reading dead letters whose unique key is taken"),
                ))?;
        Ok(rows.into_iter().map(KeyConflict::from).collect())
    }

    async fn finished_count(&self, filter: &FinishedFilter) -> Result<u64> {
        let t = &match filter.kind {
            FinishedKind::Completed => self.all_rows().await?,
            FinishedKind::DeadLetters => self.t.clone(),
        };
        let (condition, _, _) = finished(filter);
        let sql = format!("SELECT COUNT(*) FROM {t} WHERE {condition}");
        let mut query =
            sqlx::query_scalar(AssertSqlSafe(sql)).bind(format_timestamp(filter.before));
        if let Some(queue) = &filter.queue {
            query = query.bind(queue);
        }
        if let Some(type_name) = &filter.type_name {
            query = query.bind(type_name);
        }
        let n: i64 = query
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting finished commands")))?;
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
