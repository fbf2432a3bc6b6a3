//! PostgreSQL operator queries.
//!
//! Counts are one pass with `count(*) FILTER (…)`; bulk requeues and deletes pick a batch
//! of ids through the partial indexes (`IX_<table>_DeadLetters`, `IX_<table>_Retention`)
//! and touch those rows by primary key in the same statement. A requeue ends with a
//! `pg_notify` on the table's channel so idle processors pick the rows up at once.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::{BEGIN, PgDriver, decode_row};
use crate::command::{CommandId, CommandRow};
use crate::engine::AdminOps;
use crate::engine::admin::decode_state_count;
use crate::engine::admin::numbered_list_sql;
use crate::engine::admin::{CANCELLED, CommandCancelManyParams, CommandListParams, ListState};
use crate::engine::admin::{
    CommandGetManyParams, CommandRequeueManyParams, DeadLetterFilter, DeadLetterListParams,
    DeadLetterRequeueBatchParams, DeadLetterSummary, FinishedDeleteBatchParams, FinishedFilter,
    FinishedKind, StateCount, StateCountParams,
};
use crate::error::{Error, Result};

/// Pending: neither completed nor dead.
const PENDING: &str = r#""ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#;
/// No live lease.
const UNLEASED: &str = r#"("LockedUntil" IS NULL OR "LockedUntil" <= now())"#;
/// Dead: dead-lettered and not completed.
const DEAD: &str = r#""DeadLetteredAt" IS NOT NULL AND "ProcessedAt" IS NULL"#;
/// The assignments that put a row back to pending now (`LastError` is kept).
const REQUEUE_SET: &str = r#""RunAt" = now(), "Attempts" = 0, "DeadLetteredAt" = NULL,
                            "LockToken" = NULL, "LockedUntil" = NULL"#;
/// Dead letters at or before `$1`, of type `$2` when it is not NULL.
const DEAD_FILTER: &str = r#""DeadLetteredAt" IS NOT NULL AND "ProcessedAt" IS NULL
                             AND "DeadLetteredAt" <= $1 AND ($2::text IS NULL OR "Type" = $2)"#;

/// The `WHERE` condition and ordering column of finished rows at or before `$1`.
fn finished(kind: FinishedKind) -> (&'static str, &'static str) {
    match kind {
        FinishedKind::Completed => (
            r#""ProcessedAt" IS NOT NULL AND "ProcessedAt" <= $1"#,
            r#""ProcessedAt""#,
        ),
        FinishedKind::DeadLetters => (
            r#""DeadLetteredAt" IS NOT NULL AND "ProcessedAt" IS NULL AND "DeadLetteredAt" <= $1"#,
            r#""DeadLetteredAt""#,
        ),
    }
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
    /// Wakes idle processors listening on this table's channel.
    async fn notify_waiters(&self) -> Result<()> {
        on_pool!(self, self.pool, BEGIN, |e| sqlx::query(
            "SELECT pg_notify($1, '')"
        )
        .bind(crate::schema::notify_channel(&self.table))
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
    async fn clock_now(&self) -> Result<DateTime<Utc>> {
        on_pool!(self, self.pool, BEGIN, |e| sqlx::query_scalar(
            "SELECT now()"
        )
        .fetch_one(e))
        .await
        .map_err(self.db("reading the database clock"))
    }

    async fn state_count(&self, params: &StateCountParams) -> Result<Vec<StateCount>> {
        let t = &self.t;
        let (select, group) = if params.by_type {
            (r#""Type" AS type,"#, r#"GROUP BY "Type" ORDER BY "Type""#)
        } else {
            ("", "")
        };
        let sql = format!(
            r#"SELECT {select}
                   count(*) FILTER (WHERE {PENDING} AND {UNLEASED} AND ("RunAt" <= now() OR "RunAt" IS NULL)) AS due,
                   count(*) FILTER (WHERE {PENDING} AND {UNLEASED} AND "RunAt" > now()) AS scheduled,
                   count(*) FILTER (WHERE {PENDING} AND "LockedUntil" > now()) AS running,
                   count(*) FILTER (WHERE {DEAD}) AS dead,
                   count(*) FILTER (WHERE "ProcessedAt" IS NOT NULL) AS completed
               FROM {t} {group}"#
        );
        let rows = on_pool!(self, self.pool, BEGIN, |e| sqlx::query(AssertSqlSafe(sql))
            .fetch_all(e))
        .await
        .map_err(self.db("counting commands by state"))?;
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
               WHERE {DEAD} AND ($1::text IS NULL OR "Type" = $1)
               ORDER BY "DeadLetteredAt" DESC, "Id"
               LIMIT $2"#
        );
        let rows = on_pool!(self, self.pool, BEGIN, |e| sqlx::query(AssertSqlSafe(sql))
            .bind(&params.type_name)
            .bind(i64::from(params.limit))
            .fetch_all(e))
        .await
        .map_err(self.db("listing dead letters"))?;
        rows.iter()
            .map(|row| decode_row(row).map(DeadLetterSummary::from))
            .collect::<std::result::Result<_, sqlx::Error>>()
            .map_err(self.db("decoding a dead letter"))
    }

    async fn command_get_many(&self, params: &CommandGetManyParams<'_>) -> Result<Vec<CommandRow>> {
        let ids = params.ids;
        let t = &self.t;
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
        let sql = numbered_list_sql(&self.t, params, list_condition(params.state), '$');
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(i64::from(params.limit));
        if let Some(type_name) = &params.type_name {
            query = query.bind(type_name);
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

    async fn command_cancel_many(&self, params: &CommandCancelManyParams) -> Result<u64> {
        let t = &self.t;
        let ids: Vec<Uuid> = params.ids.iter().filter_map(CommandId::as_uuid).collect();
        let sql = format!(
            r#"UPDATE {t} SET "DeadLetteredAt" = now(), "LastError" = $2,
                              "LockToken" = NULL, "LockedUntil" = NULL
               WHERE "Id" = ANY($1) AND {PENDING} AND {UNLEASED}"#
        );
        Ok(
            on_pool!(self, self.pool, BEGIN, |e| sqlx::query(AssertSqlSafe(sql))
                .bind(ids)
                .bind(CANCELLED)
                .execute(e))
            .await
            .map_err(self.db("cancelling commands"))?
            .rows_affected(),
        )
    }

    async fn command_requeue_many(&self, params: &CommandRequeueManyParams) -> Result<u64> {
        let t = &self.t;
        let ctx = || self.ctx("requeueing commands");
        // An id that is not a UUID cannot exist here; counting it keeps all-or-nothing.
        let ids: Vec<Uuid> = params.ids.iter().filter_map(CommandId::as_uuid).collect();
        if ids.len() != params.ids.len() {
            return Ok(0);
        }
        let sql = format!(
            r#"UPDATE {t} SET {REQUEUE_SET}
               WHERE "Id" = ANY($1) AND "ProcessedAt" IS NULL AND {UNLEASED}"#
        );
        let mut tx = self.pool.begin().await.map_err(Error::db(ctx()))?;
        let done = sqlx::query(AssertSqlSafe(sql))
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(ctx()))?
            .rows_affected();
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
        let sql = format!("SELECT count(*) FROM {t} WHERE {DEAD_FILTER}");
        let n: i64 = on_pool!(self, self.pool, BEGIN, |e| sqlx::query_scalar(
            AssertSqlSafe(sql)
        )
        .bind(filter.dead_before)
        .bind(&filter.type_name)
        .fetch_one(e))
        .await
        .map_err(self.db("counting dead letters"))?;
        Ok(n.max(0) as u64)
    }

    async fn dead_letter_requeue_batch(
        &self,
        params: &DeadLetterRequeueBatchParams,
    ) -> Result<u64> {
        let t = &self.t;
        let sql = format!(
            r#"WITH batch AS (
                   SELECT "Id" FROM {t} WHERE {DEAD_FILTER}
                   ORDER BY "DeadLetteredAt" LIMIT $3
                   FOR UPDATE)
               UPDATE {t} AS c SET {REQUEUE_SET}
               FROM batch WHERE c."Id" = batch."Id""#
        );
        let done = on_pool!(self, self.pool, BEGIN, |e| sqlx::query(AssertSqlSafe(sql))
            .bind(params.filter.dead_before)
            .bind(&params.filter.type_name)
            .bind(i64::from(params.limit))
            .execute(e))
        .await
        .map_err(self.db("requeueing dead letters"))?
        .rows_affected();
        if done > 0 {
            self.notify_waiters().await?;
        }
        Ok(done)
    }

    async fn finished_count(&self, filter: &FinishedFilter) -> Result<u64> {
        let t = &self.t;
        let (condition, _) = finished(filter.kind);
        let sql = format!("SELECT count(*) FROM {t} WHERE {condition}");
        let n: i64 = on_pool!(self, self.pool, BEGIN, |e| sqlx::query_scalar(
            AssertSqlSafe(sql)
        )
        .bind(filter.before)
        .fetch_one(e))
        .await
        .map_err(self.db("counting finished commands"))?;
        Ok(n.max(0) as u64)
    }

    async fn finished_delete_batch(&self, params: &FinishedDeleteBatchParams) -> Result<u64> {
        let t = &self.t;
        let (condition, order) = finished(params.filter.kind);
        let sql = format!(
            r#"DELETE FROM {t} WHERE "Id" IN (
                   SELECT "Id" FROM {t} WHERE {condition} ORDER BY {order} LIMIT $2)"#
        );
        let done = on_pool!(self, self.pool, BEGIN, |e| sqlx::query(AssertSqlSafe(sql))
            .bind(params.filter.before)
            .bind(i64::from(params.limit))
            .execute(e))
        .await
        .map_err(self.db("purging finished commands"))?;
        Ok(done.rows_affected())
    }
}
