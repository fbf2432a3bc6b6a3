//! Queue pauses on SQLite: the queue's row in `<table>Queues`, read and upserted under the
//! write lock. Processors see a pause at their next look (every polling interval).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Row};

use super::{NOW, SqliteDriver};
use crate::engine::Lifecycle;
use crate::engine::control::{self, ControlOps, QueueState};
use crate::error::{Error, Result};
use crate::ident::Engine;

#[async_trait]
impl ControlOps for SqliteDriver {
    async fn queue_set_paused(&self, queue: &str, paused: bool) -> Result<bool> {
        let what = control::action(paused);
        control::require_v4(&self.table, self.schema_version().await?, paused)?;
        let q = self.table.queues().quoted(Engine::Sqlite);
        let run = async {
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            let before: Option<Option<i64>> = sqlx::query_scalar(AssertSqlSafe(format!(
                r#"SELECT "Paused" <> 0 FROM {q} WHERE "Queue" = ?1"#
            )))
            .bind(queue)
            .fetch_optional(&mut *tx)
            .await?;
            let before = before.flatten().unwrap_or(0) != 0;
            sqlx::query(AssertSqlSafe(format!(
                r#"INSERT INTO {q} ("Queue", "Paused", "PausedAt", "UpdatedAt")
                   VALUES (?1, ?2, CASE WHEN ?2 THEN {NOW} END, {NOW})
                   ON CONFLICT ("Queue") DO UPDATE SET
                     "PausedAt" = CASE WHEN NOT excluded."Paused" THEN NULL
                                       WHEN "Paused" THEN "PausedAt" ELSE {NOW} END,
                     "UpdatedAt" = CASE WHEN "Paused" IS excluded."Paused" THEN "UpdatedAt"
                                        ELSE {NOW} END,
                     "Paused" = excluded."Paused""#
            )))
            .bind(queue)
            .bind(i64::from(paused))
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
        let q = self.table.queues().quoted(Engine::Sqlite);
        let rows = sqlx::query(AssertSqlSafe(format!(
            r#"SELECT "Queue", "Paused" <> 0 AS "Paused", "PausedAt", "UpdatedAt" FROM {q}
               ORDER BY "Queue""#
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(Error::db(self.ctx("reading the queues' state")))?;
        let time = |row: &sqlx::sqlite::SqliteRow, column: &str| {
            row.try_get::<Option<String>, _>(column)
                .ok()
                .flatten()
                .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
                .map(|t| t.with_timezone(&Utc))
        };
        Ok(rows
            .iter()
            .map(|row| QueueState {
                queue: row.try_get("Queue").unwrap_or_default(),
                paused: row
                    .try_get::<Option<i64>, _>("Paused")
                    .ok()
                    .flatten()
                    .is_some_and(|p| p != 0),
                paused_at: time(row, "PausedAt"),
                updated_at: time(row, "UpdatedAt"),
            })
            .collect())
    }
}
