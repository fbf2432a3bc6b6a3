//! MariaDB/MySQL: the schedules' bookkeeping in `<table>Schedules`.
//!
//! A missing row is inserted with `INSERT IGNORE` in a statement of its own before the
//! advance's transaction: two replicas inserting the same key inside their transactions
//! would each take a shared lock on the duplicate and deadlock upgrading it. The advance
//! locks the row with a locking read (`FOR UPDATE` reads the latest committed version at
//! any isolation level), so a replica that waited sees what the winner recorded. Times are
//! UTC (`UTC_TIMESTAMP(6)`), like the commands table's.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;

use super::{MySqlDriver, NOW, insert_one};
use crate::engine::marks;
use crate::engine::recurring::{
    ScheduleAdvanceParams, ScheduleOps, ScheduleReadParams, ScheduleState,
};
use crate::error::{Error, Result};
use crate::ident::Engine;
use crate::recurring::Plan;

impl MySqlDriver {
    /// The quoted bookkeeping table.
    fn schedules_table(&self) -> String {
        self.table.schedules().quoted(Engine::Mysql)
    }
}

#[async_trait]
impl ScheduleOps for MySqlDriver {
    async fn schedule_read(&self, params: &ScheduleReadParams<'_>) -> Result<ScheduleState> {
        let s = self.schedules_table();
        let ctx = || self.ctx("reading the schedules' last occurrences");
        let now: DateTime<Utc> = sqlx::query_scalar(AssertSqlSafe(format!("SELECT {NOW}")))
            .fetch_one(&self.pool)
            .await
            .map_err(Error::db(ctx()))?;
        let mut last = HashMap::new();
        if !params.names.is_empty() {
            let sql = format!(
                "SELECT `Name`, `LastOccurrence` FROM {s} WHERE `Name` IN ({})",
                marks(params.names.len())
            );
            let mut query =
                sqlx::query_as::<_, (String, Option<DateTime<Utc>>)>(AssertSqlSafe(sql));
            for name in params.names {
                query = query.bind(name);
            }
            let rows = query
                .fetch_all(&self.pool)
                .await
                .map_err(Error::db(ctx()))?;
            last.extend(rows);
        }
        Ok(ScheduleState { now, last })
    }

    async fn schedule_advance(&self, params: &ScheduleAdvanceParams<'_>) -> Result<Option<Plan>> {
        let schedule = params.schedule;
        let s = self.schedules_table();
        let ctx = || self.ctx(&format!("advancing schedule `{}`", schedule.name));
        if !params.row_exists {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT IGNORE INTO {s} (`Name`) VALUES (?)"
            )))
            .bind(&schedule.name)
            .execute(&self.pool)
            .await
            .map_err(Error::db(ctx()))?;
        }
        let mut tx = self.pool.begin().await.map_err(Error::db(ctx()))?;
        let (now, last): (DateTime<Utc>, Option<DateTime<Utc>>) = sqlx::query_as(AssertSqlSafe(
            format!("SELECT {NOW}, `LastOccurrence` FROM {s} WHERE `Name` = ? FOR UPDATE"),
        ))
        .bind(&schedule.name)
        .fetch_one(&mut *tx)
        .await
        .map_err(Error::db(ctx()))?;
        let Some(plan) = schedule.plan(last, now) else {
            return Ok(None);
        };
        let advanced = sqlx::query(AssertSqlSafe(format!(
            "UPDATE {s} SET `LastOccurrence` = ?, `UpdatedAt` = {NOW} \
             WHERE `Name` = ? AND (`LastOccurrence` IS NULL OR `LastOccurrence` < ?)"
        )))
        .bind(plan.advance_to)
        .bind(&schedule.name)
        .bind(plan.advance_to)
        .execute(&mut *tx)
        .await
        .map_err(Error::db(ctx()))?
        .rows_affected();
        if advanced != 1 {
            return Ok(None);
        }
        let inserts = self.inserts();
        for occurrence in &plan.run {
            let command = schedule.command(*occurrence);
            insert_one(&mut tx, &inserts, &self.table, &command, 2).await?;
        }
        tx.commit().await.map_err(Error::db(ctx()))?;
        Ok(Some(plan))
    }
}
