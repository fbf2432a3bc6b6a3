//! Queue pauses on MySQL/MariaDB: the queue's row in `<table>Queues`, read under a lock and
//! upserted in one transaction. Processors see a pause at their next look (every polling
//! interval).

use async_trait::async_trait;
use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::{AssertSqlSafe, Row};

use super::MySqlDriver;
use crate::engine::Lifecycle;
use crate::engine::control::{self, ControlOps, QueueState};
use crate::error::{Error, Result};
use crate::ident::Engine;

#[async_trait]
impl ControlOps for MySqlDriver {
    async fn queue_set_paused(&self, queue: &str, paused: bool) -> Result<bool> {
        let what = control::action(paused);
        control::require_v4(&self.table, self.schema_version().await?, paused)?;
        let q = self.table.queues().quoted(Engine::Mysql);
        let run = async {
            let mut tx = self.pool.begin().await?;
            let before: Option<Option<bool>> = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT `Paused` <> 0 FROM {q} WHERE `Queue` = ? FOR UPDATE"
            )))
            .bind(queue)
            .fetch_optional(&mut *tx)
            .await?;
            let before = before.flatten().unwrap_or(false);
            // Assignments run left to right: the times are set from the old `Paused`.
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {q} (`Queue`, `Paused`, `PausedAt`, `UpdatedAt`) \
                 VALUES (?, ?, IF(?, UTC_TIMESTAMP(6), NULL), UTC_TIMESTAMP(6)) \
                 ON DUPLICATE KEY UPDATE \
                   `PausedAt` = IF(VALUES(`Paused`), IF(`Paused`, `PausedAt`, UTC_TIMESTAMP(6)), NULL), \
                   `UpdatedAt` = IF(`Paused` <=> VALUES(`Paused`), `UpdatedAt`, UTC_TIMESTAMP(6)), \
                   `Paused` = VALUES(`Paused`)"
            )))
            .bind(queue)
            .bind(paused)
            .bind(paused)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(before != paused)
        };
        run.await.map_err(Error::db(self.ctx(what)))
    }

    async fn queue_states(&self) -> Result<Vec<QueueState>> {
        if self.schema_version().await? < 4 {
            return Ok(Vec::new());
        }
        let q = self.table.queues().quoted(Engine::Mysql);
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT `Queue`, `Paused` <> 0 AS `Paused`, `PausedAt`, `UpdatedAt` FROM {q} \
             ORDER BY `Queue`"
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(Error::db(self.ctx("reading the queues' state")))?;
        let time = |row: &sqlx::mysql::MySqlRow, column: &str| {
            row.try_get::<Option<NaiveDateTime>, _>(column)
                .ok()
                .flatten()
                .map(|t| DateTime::<Utc>::from_naive_utc_and_offset(t, Utc))
        };
        Ok(rows
            .iter()
            .map(|row| QueueState {
                queue: row.try_get("Queue").unwrap_or_default(),
                paused: row
                    .try_get::<Option<bool>, _>("Paused")
                    .ok()
                    .flatten()
                    .unwrap_or(false),
                paused_at: time(row, "PausedAt"),
                updated_at: time(row, "UpdatedAt"),
            })
            .collect())
    }
}
