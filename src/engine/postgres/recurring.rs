//! PostgreSQL: the schedules' bookkeeping in `<table>Schedules`.
//!
//! The advance runs `READ COMMITTED` whatever the server's default, so a replica that
//! waited on the row lock reads the row as the winner committed it (a stricter level would
//! fail it with a serialization error instead). The row is locked with `FOR UPDATE`; the
//! command inserts are the queue path's own (`ON CONFLICT` on the unique key).

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;

use super::{BEGIN, PgDriver, insert_with};
use crate::engine::recurring::{
    ScheduleAdvanceParams, ScheduleOps, ScheduleReadParams, ScheduleState,
};
use crate::error::{Error, Result};
use crate::ident::Engine;
use crate::recurring::Plan;

impl PgDriver {
    /// The quoted bookkeeping table.
    fn schedules_table(&self) -> String {
        self.table.schedules().quoted(Engine::Postgres)
    }
}

#[async_trait]
impl ScheduleOps for PgDriver {
    async fn schedule_read(&self, params: &ScheduleReadParams<'_>) -> Result<ScheduleState> {
        let s = self.schedules_table();
        // One round trip: the clock, and each row (a NULL name when there are none).
        let sql = format!(
            r#"SELECT now() AS "Now", s."Name", s."LastOccurrence"
               FROM (SELECT 1) AS one
               LEFT JOIN {s} AS s ON s."Name" = ANY($1)"#
        );
        let query = sqlx::query_as::<_, (DateTime<Utc>, Option<String>, Option<DateTime<Utc>>)>(
            AssertSqlSafe(sql),
        )
        .bind(params.names);
        let rows = on_pool!(self, self.pool, BEGIN, |e| query.fetch_all(e))
            .await
            .map_err(self.db("reading the schedules' last occurrences"))?;
        let now = rows
            .first()
            .map(|(now, _, _)| *now)
            .ok_or_else(|| Error::invalid("the database returned no time"))?;
        let last: HashMap<String, Option<DateTime<Utc>>> = rows
            .into_iter()
            .filter_map(|(_, name, last)| name.map(|name| (name, last)))
            .collect();
        Ok(ScheduleState { now, last })
    }

    async fn schedule_advance(&self, params: &ScheduleAdvanceParams<'_>) -> Result<Option<Plan>> {
        let schedule = params.schedule;
        let s = self.schedules_table();
        let what = format!("advancing schedule `{}`", schedule.name);
        let mut tx = self
            .pool
            .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
            .await
            .map_err(self.db(&what))?;
        if !params.row_exists {
            sqlx::query(AssertSqlSafe(format!(
                r#"INSERT INTO {s} ("Name") VALUES ($1) ON CONFLICT ("Name") DO NOTHING"#
            )))
            .bind(&schedule.name)
            .execute(&mut *tx)
            .await
            .map_err(self.db(&what))?;
        }
        let (now, last): (DateTime<Utc>, Option<DateTime<Utc>>) = sqlx::query_as(AssertSqlSafe(
            format!(r#"SELECT now(), "LastOccurrence" FROM {s} WHERE "Name" = $1 FOR UPDATE"#),
        ))
        .bind(&schedule.name)
        .fetch_one(&mut *tx)
        .await
        .map_err(self.db(&what))?;
        let Some(plan) = schedule.plan(last, now) else {
            return Ok(None);
        };
        let advanced = sqlx::query(AssertSqlSafe(format!(
            r#"UPDATE {s} SET "LastOccurrence" = $2, "UpdatedAt" = now()
               WHERE "Name" = $1 AND ("LastOccurrence" IS NULL OR "LastOccurrence" < $2)"#
        )))
        .bind(&schedule.name)
        .bind(plan.advance_to)
        .execute(&mut *tx)
        .await
        .map_err(self.db(&what))?
        .rows_affected();
        if advanced != 1 {
            return Ok(None);
        }
        let inserts = self.inserts();
        for occurrence in &plan.run {
            let command = schedule.command(*occurrence);
            insert_with(&mut tx, &inserts, &self.table, &command, 2).await?;
        }
        tx.commit().await.map_err(self.db(&what))?;
        Ok(Some(plan))
    }
}
