//! MySQL/MariaDB operator queries.
//!
//! MySQL cannot `DELETE … WHERE Id IN (SELECT … FROM the same table … LIMIT n)`, so a
//! purge batch reads up to `n` ids through the retention or dead-letter index and then
//! deletes exactly those rows by primary key, re-checking the condition; both statements
//! are short and autocommitted, so InnoDB never holds a range lock across the whole purge.
//! Times are `DATETIME(6)` UTC, bound as naive UTC values.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;

use super::{COLUMNS, MySqlDriver, NOW, decode_row};
use crate::command::CommandRow;
use crate::engine::AdminOps;
use crate::engine::admin::decode_state_count;
use crate::engine::admin::{CANCELLED, CommandCancelManyParams, CommandListParams, ListState};
use crate::engine::admin::{
    CommandGetManyParams, CommandRequeueManyParams, DeadLetterFilter, DeadLetterListParams,
    DeadLetterRequeueBatchParams, DeadLetterSummary, FinishedDeleteBatchParams, FinishedFilter,
    FinishedKind, StateCount, StateCountParams,
};
use crate::engine::marks;
use crate::error::{Error, Result};

/// Ids per `IN (…)` list.
const IDS_PER_STATEMENT: usize = 1000;

/// Pending: neither completed nor dead.
const PENDING: &str = "`ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL";
/// Dead: dead-lettered and not completed.
const DEAD: &str = "`DeadLetteredAt` IS NOT NULL AND `ProcessedAt` IS NULL";
/// Dead letters at or before `?`, of type `?` when it is not NULL (bind the type twice).
const DEAD_FILTER: &str = "`DeadLetteredAt` IS NOT NULL AND `ProcessedAt` IS NULL \
     AND `DeadLetteredAt` <= ? AND (? IS NULL OR `Type` = ?)";

/// No live lease.
fn unleased() -> String {
    format!("(`LockedUntil` IS NULL OR `LockedUntil` <= {NOW})")
}

/// The assignments that put a row back to pending now (`LastError` is kept).
fn requeue_set() -> String {
    format!(
        "`RunAt` = {NOW}, `Attempts` = 0, `DeadLetteredAt` = NULL, \
         `LockToken` = NULL, `LockedUntil` = NULL"
    )
}

/// The `WHERE` condition and ordering column of finished rows at or before `?`.
fn finished(kind: FinishedKind) -> (&'static str, &'static str) {
    match kind {
        FinishedKind::Completed => (
            "`ProcessedAt` IS NOT NULL AND `ProcessedAt` <= ?",
            "`ProcessedAt`",
        ),
        FinishedKind::DeadLetters => (
            "`DeadLetteredAt` IS NOT NULL AND `ProcessedAt` IS NULL AND `DeadLetteredAt` <= ?",
            "`DeadLetteredAt`",
        ),
    }
}

/// The condition that selects a listing's rows.
fn list_condition(state: ListState) -> String {
    let unleased = unleased();
    match state {
        ListState::Pending => PENDING.to_owned(),
        ListState::Due => {
            format!("{PENDING} AND {unleased} AND (`RunAt` <= {NOW} OR `RunAt` IS NULL)")
        }
        ListState::Scheduled => format!("{PENDING} AND {unleased} AND `RunAt` > {NOW}"),
        ListState::Running => format!("{PENDING} AND `LockedUntil` > {NOW}"),
        ListState::Dead => DEAD.to_owned(),
        ListState::Completed => "`ProcessedAt` IS NOT NULL".to_owned(),
    }
}

/// A listing page (see the PostgreSQL driver). Placeholders are positional: type,
/// before, then the `after` id three times, then the limit.
fn list_sql(t: &str, params: &CommandListParams) -> String {
    let key = format!("`{}`", params.state.key_column());
    let (dir, cmp) = if params.state.newest_first() {
        ("DESC", "<")
    } else {
        ("ASC", ">")
    };
    let mut conditions = vec![list_condition(params.state)];
    if params.type_name.is_some() {
        conditions.push("`Type` = ?".into());
    }
    if params.before.is_some() {
        conditions.push(format!("{key} < ?"));
    }
    if params.after.is_some() {
        let k = format!("(SELECT {key} FROM {t} WHERE `Id` = ?)");
        conditions.push(format!(
            "{key} {cmp}= {k} AND ({key} {cmp} {k} OR `Id` {cmp} ?)"
        ));
    }
    format!(
        "SELECT {COLUMNS} FROM {t} WHERE {} ORDER BY {key} {dir}, `Id` {dir} LIMIT ?",
        conditions.join(" AND ")
    )
}

#[async_trait]
impl AdminOps for MySqlDriver {
    async fn command_list(&self, params: &CommandListParams) -> Result<Vec<CommandRow>> {
        let sql = list_sql(&self.t, params);
        let mut query = sqlx::query(AssertSqlSafe(sql));
        if let Some(type_name) = &params.type_name {
            query = query.bind(type_name);
        }
        if let Some(before) = params.before {
            query = query.bind(before);
        }
        if let Some(after) = &params.after {
            let id = after.to_string();
            query = query.bind(id.clone()).bind(id.clone()).bind(id);
        }
        let rows = query
            .bind(i64::from(params.limit))
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
            let sql = format!(
                "UPDATE {t} SET `DeadLetteredAt` = {NOW}, `LastError` = ?, \
                 `LockToken` = NULL, `LockedUntil` = NULL \
                 WHERE `Id` IN ({}) AND {PENDING} AND {unleased}",
                marks(chunk.len())
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
        let now: chrono::NaiveDateTime = sqlx::query_scalar(AssertSqlSafe(format!("SELECT {NOW}")))
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("reading the database clock")))?;
        Ok(now.and_utc())
    }

    async fn state_count(&self, params: &StateCountParams) -> Result<Vec<StateCount>> {
        let t = &self.t;
        let unleased = unleased();
        let (select, group) = if params.by_type {
            ("`Type` AS type,", "GROUP BY `Type` ORDER BY `Type`")
        } else {
            ("", "")
        };
        let sum = |condition: &str| format!("CAST(COALESCE(SUM({condition}), 0) AS SIGNED)");
        let sql = format!(
            "SELECT {select} \
               {} AS due, {} AS scheduled, {} AS running, {} AS dead, {} AS completed \
             FROM {t} {group}",
            sum(&format!(
                "{PENDING} AND {unleased} AND (`RunAt` <= {NOW} OR `RunAt` IS NULL)"
            )),
            sum(&format!("{PENDING} AND {unleased} AND `RunAt` > {NOW}")),
            sum(&format!("{PENDING} AND COALESCE(`LockedUntil` > {NOW}, 0)")),
            sum(DEAD),
            sum("`ProcessedAt` IS NOT NULL"),
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
            "SELECT {COLUMNS} FROM {t} \
             WHERE {DEAD} AND (? IS NULL OR `Type` = ?) \
             ORDER BY `DeadLetteredAt` DESC, `Id` \
             LIMIT ?"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(&params.type_name)
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
            let sql = format!(
                "SELECT {COLUMNS} FROM {t} WHERE `Id` IN ({}) ORDER BY `CreatedAt`, `Id`",
                marks(chunk.len())
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
        let (set, unleased) = (requeue_set(), unleased());
        let mut tx = self.pool.begin().await.map_err(Error::db(ctx()))?;
        let mut done = 0;
        for chunk in params.ids.chunks(IDS_PER_STATEMENT) {
            let sql = format!(
                "UPDATE {t} SET {set} \
                 WHERE `Id` IN ({}) AND `ProcessedAt` IS NULL AND {unleased}",
                marks(chunk.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for id in chunk {
                query = query.bind(id.to_string());
            }
            // The connection reports matched (not merely changed) rows: CLIENT_FOUND_ROWS.
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
            .bind(filter.dead_before.naive_utc())
            .bind(&filter.type_name)
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
        // A single-table UPDATE may take ORDER BY … LIMIT: one short statement per batch,
        // walking IX_<table>_DeadLetters.
        let sql =
            format!("UPDATE {t} SET {set} WHERE {DEAD_FILTER} ORDER BY `DeadLetteredAt` LIMIT ?");
        let filter = &params.filter;
        let done = sqlx::query(AssertSqlSafe(sql))
            .bind(filter.dead_before.naive_utc())
            .bind(&filter.type_name)
            .bind(&filter.type_name)
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
            .bind(filter.before.naive_utc())
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(self.ctx("counting finished commands")))?;
        Ok(n.max(0) as u64)
    }

    async fn finished_delete_batch(&self, params: &FinishedDeleteBatchParams) -> Result<u64> {
        let t = &self.t;
        let ctx = || self.ctx("purging finished commands");
        let (condition, order) = finished(params.filter.kind);
        let before = params.filter.before.naive_utc();
        let select = format!("SELECT `Id` FROM {t} WHERE {condition} ORDER BY {order} LIMIT ?");
        let ids: Vec<String> = sqlx::query_scalar(AssertSqlSafe(select))
            .bind(before)
            .bind(i64::from(params.limit))
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(ctx()))?;
        let mut done = 0;
        for chunk in ids.chunks(IDS_PER_STATEMENT) {
            let delete = format!(
                "DELETE FROM {t} WHERE `Id` IN ({}) AND {condition}",
                marks(chunk.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(delete));
            for id in chunk {
                query = query.bind(id);
            }
            done += query
                .bind(before)
                .execute(&self.pool)
                .await
                .map_err(Error::db(ctx()))?
                .rows_affected();
        }
        Ok(done)
    }
}
