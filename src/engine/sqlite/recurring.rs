//! SQLite: the schedules' bookkeeping in `<table>Schedules`.
//!
//! SQLite has one writer at a time: the advance is a `BEGIN IMMEDIATE` transaction, so
//! replicas sharing the file take turns and each reads the row as the one before left it.
//! It runs on the durable pool (`synchronous = FULL`), not the processor's faster write
//! connections: a recorded occurrence whose command a power loss took would be lost, not
//! run again. Times are icq's UTC text (`2026-01-31T12:00:00.000Z`), whose text order is
//! time order, so the guard compares them as text.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Row};

use super::{NOW, SqliteDriver, insert_one};
use crate::command::{format_timestamp, parse_timestamp};
use crate::engine::marks;
use crate::engine::recurring::{
    ScheduleAdvanceParams, ScheduleOps, ScheduleReadParams, ScheduleState,
};
use crate::error::{Error, Result};
use crate::ident::Engine;
use crate::recurring::Plan;

impl SqliteDriver {
    /// The quoted bookkeeping table.
    fn schedules_table(&self) -> String {
        self.table.schedules().quoted(Engine::Sqlite)
    }
}

/// A stored time, or an error naming the row.
fn decode_time(text: &str, name: &str) -> Result<DateTime<Utc>> {
    parse_timestamp(text).ok_or_else(|| {
        Error::invalid(format!(
            "schedule `{name}`: `LastOccurrence` holds `{}`, which is not a UTC timestamp",
            crate::redact::echo(text)
        ))
    })
}

#[async_trait]
impl ScheduleOps for SqliteDriver {
    async fn schedule_read(&self, params: &ScheduleReadParams<'_>) -> Result<ScheduleState> {
        let s = self.schedules_table();
        let ctx = || self.ctx("reading the schedules' last occurrences");
        let now: String = sqlx::query_scalar(AssertSqlSafe(format!("SELECT {NOW}")))
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(ctx()))?;
        let now = decode_time(&now, "now")?;
        let mut last = HashMap::new();
        if !params.names.is_empty() {
            let sql = format!(
                r#"SELECT "Name", "LastOccurrence" FROM {s} WHERE "Name" IN ({})"#,
                marks(params.names.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for name in params.names {
                query = query.bind(name);
            }
            for row in query
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db(ctx()))?
            {
                let name: String = row.try_get("Name").map_err(Error::db(ctx()))?;
                let at: Option<String> = row.try_get("LastOccurrence").map_err(Error::db(ctx()))?;
                let at = at.map(|at| decode_time(&at, &name)).transpose()?;
                last.insert(name, at);
            }
        }
        Ok(ScheduleState { now, last })
    }

    async fn schedule_advance(&self, params: &ScheduleAdvanceParams<'_>) -> Result<Option<Plan>> {
        let schedule = params.schedule;
        let s = self.schedules_table();
        let ctx = || self.ctx(&format!("advancing schedule `{}`", schedule.name));
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(Error::db(ctx()))?;
        if !params.row_exists {
            sqlx::query(AssertSqlSafe(format!(
                r#"INSERT INTO {s} ("Name", "UpdatedAt") VALUES (?1, {NOW})
                   ON CONFLICT ("Name") DO NOTHING"#
            )))
            .bind(&schedule.name)
            .execute(&mut *tx)
            .await
            .map_err(Error::db(ctx()))?;
        }
        let (now, last): (String, Option<String>) = sqlx::query_as(AssertSqlSafe(format!(
            r#"SELECT {NOW}, "LastOccurrence" FROM {s} WHERE "Name" = ?1"#
        )))
        .bind(&schedule.name)
        .fetch_one(&mut *tx)
        .await
        .map_err(Error::db(ctx()))?;
        let now = decode_time(&now, "now")?;
        let last = last
            .map(|at| decode_time(&at, &schedule.name))
            .transpose()?;
        let Some(plan) = schedule.plan(last, now) else {
            return Ok(None);
        };
        let advanced = sqlx::query(AssertSqlSafe(format!(
            r#"UPDATE {s} SET "LastOccurrence" = ?2, "UpdatedAt" = {NOW}
               WHERE "Name" = ?1 AND ("LastOccurrence" IS NULL OR "LastOccurrence" < ?2)"#
        )))
        .bind(&schedule.name)
        .bind(format_timestamp(plan.advance_to))
        .execute(&mut *tx)
        .await
        .map_err(Error::db(ctx()))?
        .rows_affected();
        if advanced != 1 {
            return Ok(None);
        }
        for occurrence in &plan.run {
            let command = schedule.command(*occurrence);
            insert_one(
                &mut tx,
                &self.sql.insert,
                &self.sql.pending_by_key,
                &self.t,
                &self.table,
                &command,
                2,
            )
            .await?;
        }
        tx.commit().await.map_err(Error::db(ctx()))?;
        Ok(Some(plan))
    }
}
