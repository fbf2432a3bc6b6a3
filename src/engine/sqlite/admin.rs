//! SQLite operator queries.
//!
//! Timestamps are compared as text in icq's fixed UTC format (text order is time order),
//! so cutoffs are bound as [`format_timestamp`] strings. Bulk requeues and deletes pick a
//! batch of ids in a subquery and touch those rows by primary key in the same statement;
//! each statement is its own short write transaction, so the processor's writes
//! interleave with a long purge instead of waiting behind it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;

use super::{NOW, SqliteDriver, decode_row};
use crate::command::{CommandRow, format_timestamp, parse_timestamp};
use crate::engine::admin::decode_state_count;
use crate::engine::admin::numbered_list_sql;
use crate::engine::admin::{CANCELLED, CommandCancelManyParams, CommandListParams, ListState};
use crate::engine::admin::{
    CommandGetManyParams, CommandRequeueManyParams, DeadLetterFilter, DeadLetterListParams,
    DeadLetterRequeueBatchParams, DeadLetterSummary, FinishedDeleteBatchParams, FinishedFilter,
    FinishedKind, StateCount, StateCountParams,
};
use crate::engine::{AdminOps, marks};
use crate::error::{Error, Result};

/// Ids per `IN (…)` list, well under SQLite's bound-parameter limit.
const IDS_PER_STATEMENT: usize = 500;

/// Pending: neither completed nor dead.
const PENDING: &str = r#""ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#;
/// Dead: dead-lettered and not completed.
const DEAD: &str = r#""DeadLetteredAt" IS NOT NULL AND "ProcessedAt" IS NULL"#;
/// Dead letters at or before `?1`, of type `?2` when it is not NULL.
const DEAD_FILTER: &str = r#""DeadLetteredAt" IS NOT NULL AND "ProcessedAt" IS NULL
                             AND "DeadLetteredAt" <= ?1 AND (?2 IS NULL OR "Type" = ?2)"#;

/// No live lease.
fn unleased() -> String {
    format!(r#"("LockedUntil" IS NULL OR "LockedUntil" <= {NOW})"#)
}

/// The assignments that put a row back to pending now (`LastError` is kept).
fn requeue_set() -> String {
    format!(
        r#""RunAt" = {NOW}, "Attempts" = 0, "DeadLetteredAt" = NULL,
           "LockToken" = NULL, "LockedUntil" = NULL"#
    )
}

/// The `WHERE` condition and ordering column of finished rows at or before `?1`.
fn finished(kind: FinishedKind) -> (&'static str, &'static str) {
    match kind {
        FinishedKind::Completed => (
            r#""ProcessedAt" IS NOT NULL AND "ProcessedAt" <= ?1"#,
            r#""ProcessedAt""#,
        ),
        FinishedKind::DeadLetters => (
            r#""DeadLetteredAt" IS NOT NULL AND "ProcessedAt" IS NULL AND "DeadLetteredAt" <= ?1"#,
            r#""DeadLetteredAt""#,
        ),
    }
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

#[async_trait]
impl AdminOps for SqliteDriver {
    async fn command_list(&self, params: &CommandListParams) -> Result<Vec<CommandRow>> {
        let sql = numbered_list_sql(&self.t, params, list_condition(params.state), '?');
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(i64::from(params.limit));
        if let Some(type_name) = &params.type_name {
            query = query.bind(type_name);
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

    async fn command_cancel_many(&self, params: &CommandCancelManyParams) -> Result<u64> {
        let t = &self.t;
        let unleased = unleased();
        let mut done = 0;
        for chunk in params.ids.chunks(IDS_PER_STATEMENT) {
            let marks = marks(chunk.len());
            let sql = format!(
                r#"UPDATE {t} SET "DeadLetteredAt" = {NOW}, "LastError" = ?,
                                  "LockToken" = NULL, "LockedUntil" = NULL
                   WHERE "Id" IN ({marks}) AND {PENDING} AND {unleased}"#
            );
            let mut query = sqlx::query(AssertSqlSafe(sql)).bind(CANCELLED);
            for id in chunk {
                query = query.bind(id.to_string());
            }
            done += query
                .execute(&self.pool)
                .await
                .map_err(Error::db(self.ctx("cancelling commands")))?
                .rows_affected();
        }
        Ok(done)
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
        let t = &self.t;
        let unleased = unleased();
        let (select, group) = if params.by_type {
            (r#""Type" AS type,"#, r#"GROUP BY "Type" ORDER BY "Type""#)
        } else {
            ("", "")
        };
        let sql = format!(
            r#"SELECT {select}
                   COALESCE(SUM({PENDING} AND {unleased} AND ("RunAt" <= {NOW} OR "RunAt" >= ':' OR "RunAt" IS NULL)), 0) AS due,
                   COALESCE(SUM({PENDING} AND {unleased} AND "RunAt" > {NOW} AND "RunAt" < ':'), 0) AS scheduled,
                   COALESCE(SUM({PENDING} AND COALESCE("LockedUntil" > {NOW}, 0)), 0) AS running,
                   COALESCE(SUM({DEAD}), 0) AS dead,
                   COALESCE(SUM("ProcessedAt" IS NOT NULL), 0) AS completed
               FROM {t} {group}"#
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting commands by state")))?;
        rows.iter()
            .map(|row| decode_state_count(row, params.by_type))
            .collect()
    }

    async fn dead_letter_list(
        &self,
        params: &DeadLetterListParams,
    ) -> Result<Vec<DeadLetterSummary>> {
        let t = &self.t;
        let sql = format!(
            r#"SELECT * FROM {t}
               WHERE {DEAD} AND (?1 IS NULL OR "Type" = ?1)
               ORDER BY "DeadLetteredAt" DESC, "Id"
               LIMIT ?2"#
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(&params.type_name)
            .bind(i64::from(params.limit))
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(self.ctx("listing dead letters")))?;
        rows.iter()
            .map(|row| decode_row(row).map(DeadLetterSummary::from))
            .collect::<std::result::Result<_, _>>()
            .map_err(Error::db(self.ctx("decoding a dead letter")))
    }

    async fn command_get_many(&self, params: &CommandGetManyParams<'_>) -> Result<Vec<CommandRow>> {
        let ids = params.ids;
        let t = &self.t;
        let mut found = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(IDS_PER_STATEMENT) {
            let marks = marks(chunk.len());
            let sql =
                format!(r#"SELECT * FROM {t} WHERE "Id" IN ({marks}) ORDER BY "CreatedAt", "Id""#);
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
        let (set, unleased) = (requeue_set(), unleased());
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
            done += query
                .execute(&mut *tx)
                .await
                .map_err(Error::db(ctx()))?
                .rows_affected();
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
        let sql = format!("SELECT COUNT(*) FROM {t} WHERE {DEAD_FILTER}");
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(format_timestamp(filter.dead_before))
            .bind(&filter.type_name)
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting dead letters")))?;
        Ok(n.max(0) as u64)
    }

    async fn dead_letter_requeue_batch(
        &self,
        params: &DeadLetterRequeueBatchParams,
    ) -> Result<u64> {
        let t = &self.t;
        let set = requeue_set();
        let sql = format!(
            r#"UPDATE {t} SET {set} WHERE "Id" IN (
                   SELECT "Id" FROM {t} WHERE {DEAD_FILTER}
                   ORDER BY "DeadLetteredAt" LIMIT ?3)"#
        );
        let done = sqlx::query(AssertSqlSafe(sql))
            .bind(format_timestamp(params.filter.dead_before))
            .bind(&params.filter.type_name)
            .bind(i64::from(params.limit))
            .execute(&self.pool)
            .await
            .map_err(Error::db(self.ctx("requeueing dead letters")))?;
        Ok(done.rows_affected())
    }

    async fn finished_count(&self, filter: &FinishedFilter) -> Result<u64> {
        let t = &self.t;
        let (condition, _) = finished(filter.kind);
        let sql = format!("SELECT COUNT(*) FROM {t} WHERE {condition}");
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(format_timestamp(filter.before))
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting finished commands")))?;
        Ok(n.max(0) as u64)
    }

    async fn finished_delete_batch(&self, params: &FinishedDeleteBatchParams) -> Result<u64> {
        let t = &self.t;
        let (condition, order) = finished(params.filter.kind);
        let sql = format!(
            r#"DELETE FROM {t} WHERE "Id" IN (
                   SELECT "Id" FROM {t} WHERE {condition} ORDER BY {order} LIMIT ?2)"#
        );
        let done = sqlx::query(AssertSqlSafe(sql))
            .bind(format_timestamp(params.filter.before))
            .bind(i64::from(params.limit))
            .execute(&self.pool)
            .await
            .map_err(Error::db(self.ctx("purging finished commands")))?;
        Ok(done.rows_affected())
    }
}
