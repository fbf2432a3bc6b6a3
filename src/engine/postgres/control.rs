//! Queue pauses on PostgreSQL: an upsert of the queue's row in `<table>Queues` and, in the
//! same statement, a NOTIFY on the table's cancel channel so listening processors re-read
//! the paused queues at once.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Row};

use super::{BEGIN, PgDriver};
use crate::engine::Lifecycle;
use crate::engine::control::{self, ControlOps, QUEUES_CHANGED, QueueState};
use crate::error::Result;
use crate::ident::Engine;

#[async_trait]
impl ControlOps for PgDriver {
    async fn queue_set_paused(&self, queue: &str, paused: bool) -> Result<bool> {
        control::require_v4(&self.table, self.schema_version().await?, paused)?;
        let q = self.table.queues().quoted(Engine::Postgres);
        // The row's state before (the statement's snapshot: a lock here would skip the row
        // the upsert changes in the same statement); the upsert keeps the first pause's
        // time.
        let sql = format!(
            r#"WITH before AS (SELECT "Paused" FROM {q} WHERE "Queue" = $1),
                    up AS (
                      INSERT INTO {q} AS q ("Queue", "Paused", "PausedAt", "UpdatedAt")
                      VALUES ($1, $2, CASE WHEN $2 THEN now() END, now())
                      ON CONFLICT ("Queue") DO UPDATE SET
                        "Paused" = EXCLUDED."Paused",
                        "PausedAt" = CASE WHEN NOT EXCLUDED."Paused" THEN NULL
                                          WHEN q."Paused" THEN q."PausedAt" ELSE now() END,
                        "UpdatedAt" = CASE WHEN q."Paused" IS NOT DISTINCT FROM EXCLUDED."Paused"
                                           THEN q."UpdatedAt" ELSE now() END
                      RETURNING 1)
               SELECT COALESCE((SELECT "Paused" FROM before), false) <> $2 AS changed
               FROM (SELECT count(*) FROM up) AS u, (SELECT pg_notify($3, $4)) AS n"#
        );
        let query = sqlx::query_scalar::<_, bool>(AssertSqlSafe(sql))
            .bind(queue)
            .bind(paused)
            .bind(self.table.cancel_channel())
            .bind(QUEUES_CHANGED);
        on_pool!(self, self.pool, BEGIN, |e| query.fetch_one(e))
            .await
            .map_err(self.db(control::action(paused)))
    }

    async fn queue_states(&self) -> Result<Vec<QueueState>> {
        if self.schema_version().await? < 4 {
            return Ok(Vec::new());
        }
        let q = self.table.queues().quoted(Engine::Postgres);
        let sql = format!(
            r#"SELECT "Queue", "Paused", "PausedAt", "UpdatedAt" FROM {q} ORDER BY "Queue""#
        );
        let query = sqlx::query(AssertSqlSafe(sql));
        let rows = on_pool!(self, self.pool, BEGIN, |e| query.fetch_all(e))
            .await
            .map_err(self.db("reading the queues' state"))?;
        Ok(rows
            .iter()
            .map(|row| QueueState {
                queue: row.try_get("Queue").unwrap_or_default(),
                paused: row
                    .try_get::<Option<bool>, _>("Paused")
                    .ok()
                    .flatten()
                    .unwrap_or(false),
                paused_at: row
                    .try_get::<Option<DateTime<Utc>>, _>("PausedAt")
                    .ok()
                    .flatten(),
                updated_at: row
                    .try_get::<Option<DateTime<Utc>>, _>("UpdatedAt")
                    .ok()
                    .flatten(),
            })
            .collect())
    }
}
