//! SQLite's limited claim ([`crate::engine::limits`]): one `BEGIN IMMEDIATE` transaction
//! that stamps, reads (inserting it first when missing) the queue's row of
//! `<table>Queues`, counts, picks the candidates, leases the ones the limits allow and
//! takes the tokens. SQLite has one writer, and `BEGIN IMMEDIATE` takes the write lock
//! before the first read, so limited claims of a queue run one after the other and each
//! counts every earlier one's leases.

use std::collections::HashMap;

use sqlx::{AssertSqlSafe, Row, SqliteConnection};

use super::{NOW, SqliteDriver, decode_row, offset, parse_timestamp, payload_bytes};
use crate::engine::Lifecycle;
use crate::engine::limits::{self, Candidates, LimitedTx, PlaceRow, Places, QueueRow};
use crate::engine::{ClaimParams, ClaimedRow, LimitedClaim, LimitedClaimParams, SetState};
use crate::error::{Error, Result};
use crate::ident::Engine;

/// The pending rows' condition.
const PENDING: &str = r#""ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#;

struct Tx<'a> {
    driver: &'a SqliteDriver,
    conn: &'a mut SqliteConnection,
    q: String,
    columns: &'static str,
}

fn ctx(driver: &SqliteDriver) -> String {
    driver.ctx("claiming under the queue's limits")
}

#[async_trait::async_trait]
impl LimitedTx for Tx<'_> {
    async fn read_queue(&mut self, queue: &str) -> Result<Option<QueueRow>> {
        let sql = format!(
            r#"SELECT "Paused", "RateTokens",
                      (julianday('now') - julianday("RateCheckedAt")) * 86400.0 AS "Elapsed"
               FROM {} WHERE "Queue" = ?1"#,
            self.q
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(queue)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        Ok(row.map(|row| QueueRow {
            paused: row
                .try_get::<Option<i64>, _>("Paused")
                .ok()
                .flatten()
                .unwrap_or(0)
                != 0,
            tokens: row.try_get("RateTokens").ok().flatten(),
            elapsed: row.try_get("Elapsed").ok().flatten(),
        }))
    }

    async fn insert_queue(&mut self, queue: &str) -> Result<()> {
        let sql = format!(
            r#"INSERT INTO {} ("Queue") VALUES (?1) ON CONFLICT ("Queue") DO NOTHING"#,
            self.q
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(queue)
            .execute(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        Ok(())
    }

    async fn stamp(&mut self, changes: &[SetState]) -> Result<u64> {
        let version = self.driver.schema_version().await?;
        self.driver
            .stamp_moving_on(self.conn, changes, version)
            .await
    }

    async fn running(&mut self, queue: &str) -> Result<u64> {
        // A `LockedUntil` that is not a time (text from ':' on) holds no lease.
        let sql = format!(
            r#"SELECT count(*) FROM {} WHERE "Queue" = ?1 AND {PENDING}
                 AND "LockedUntil" > {NOW} AND "LockedUntil" < ':'"#,
            self.driver.t
        );
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(queue)
            .fetch_one(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        Ok(n.max(0) as u64)
    }

    async fn candidates(
        &mut self,
        which: &Candidates<'_>,
    ) -> Result<Vec<(String, Option<String>)>> {
        let sql = format!(
            r#"SELECT "Id", "ConcurrencyKey" FROM {}
               WHERE "Queue" = ?1 AND {PENDING}
                 AND "RunAt" <= {NOW}
                 AND ("LockedUntil" IS NULL OR "LockedUntil" <= {NOW} OR "LockedUntil" >= ':')
                 AND ("CreatedAt" <= strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?2)
                      OR "CreatedAt" >= ':' OR "CreatedAt" IS NULL)
                 AND (?3 IS NULL OR "Type" IN (SELECT value FROM json_each(?3)))
                 AND ("ConcurrencyKey" IS NULL
                      OR "ConcurrencyKey" NOT IN (SELECT value FROM json_each(?4)))
                 AND "Id" NOT IN (SELECT value FROM json_each(?5))
                 AND typeof("Id") = 'text'{}
               ORDER BY "Priority", "RunAt"
               LIMIT ?6"#,
            self.driver.t,
            super::ordered_filter(&self.driver.t)
        );
        let json = |list: &[String]| serde_json::to_string(list).unwrap_or_else(|_| "[]".into());
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(which.queue)
            .bind(offset(-which.claim.processing_delay.as_secs_f64()))
            .bind(which.claim.types.as_deref().map(json))
            .bind(json(which.except_keys))
            .bind(json(which.except_ids))
            .bind(i64::from(which.limit))
            .fetch_all(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let id: String = row.try_get("Id").ok()?;
                let key: Option<String> = row.try_get("ConcurrencyKey").ok().flatten();
                Some((id, key))
            })
            .collect())
    }

    async fn running_by_key(
        &mut self,
        queue: &str,
        keys: &[String],
    ) -> Result<HashMap<String, u64>> {
        let sql = format!(
            r#"SELECT "ConcurrencyKey" AS k, count(*) AS n FROM {}
               WHERE "ConcurrencyKey" IN (SELECT value FROM json_each(?2)) AND {PENDING}
                 AND "LockedUntil" > {NOW} AND "LockedUntil" < ':' AND "Queue" = ?1
               GROUP BY 1"#,
            self.driver.t
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(queue)
            .bind(serde_json::to_string(keys).unwrap_or_else(|_| "[]".into()))
            .fetch_all(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let key: String = row.try_get("k").ok()?;
                let n: i64 = row.try_get("n").ok()?;
                Some((key, n.max(0) as u64))
            })
            .collect())
    }

    async fn lease(&mut self, ids: &[&str], claim: &ClaimParams) -> Result<Vec<ClaimedRow>> {
        let sql = format!(
            r#"UPDATE {}
               SET "LockToken" = ?1, "LockedUntil" = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?2),
                   "Attempts" = CASE WHEN "Attempts" BETWEEN 0 AND 2147483646 THEN "Attempts" + 1
                                     ELSE "Attempts" END
               WHERE "Id" IN (SELECT value FROM json_each(?3))
               RETURNING {}, {NOW} AS "IcqNow""#,
            self.driver.t, self.columns
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(claim.token.to_string())
            .bind(offset(claim.lease.as_secs_f64()))
            .bind(serde_json::to_string(ids).unwrap_or_else(|_| "[]".into()))
            .fetch_all(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        let now = rows
            .first()
            .and_then(|row| row.try_get::<String, _>("IcqNow").ok())
            .and_then(|text| parse_timestamp(&text));
        let mut claimed = crate::engine::leased_rows(
            &self.driver.table,
            claim.token,
            rows.iter().map(|row| (decode_row(row), payload_bytes(row))),
        );
        // Claimed for a `RunAt` that only sorts as due: put back by the processor, decided
        // on the database's clock (as the claim does).
        if let Some(now) = now {
            for row in &mut claimed {
                if row.row.run_at > now {
                    row.not_due_for = (row.row.run_at - now).to_std().ok();
                }
            }
        }
        Ok(claimed)
    }

    async fn places_to_hand_on(
        &mut self,
        queue: &str,
        changes: &[SetState],
        margin: std::time::Duration,
    ) -> Result<Option<Places>> {
        // The write lock is held already (`BEGIN IMMEDIATE`): the read is the count's
        // replacement, not a way around a lock.
        let sql = format!(
            r#"SELECT "Id", "LockToken", "Queue",
                      ({PENDING} AND "LockedUntil" < ':'
                       AND "LockedUntil" > strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?1)) AS "Live",
                      (SELECT "Paused" FROM {} WHERE "Queue" = ?2) AS "Paused"
               FROM {} WHERE "Id" IN (SELECT value FROM json_each(?3))"#,
            self.q, self.driver.t
        );
        let ids = serde_json::Value::from(
            changes
                .iter()
                .map(|change| change.lease.id.as_str().to_owned())
                .collect::<Vec<_>>(),
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(offset(margin.as_secs_f64()))
            .bind(queue)
            .bind(ids.to_string())
            .fetch_all(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        let flag = |row: &sqlx::sqlite::SqliteRow, column: &str| {
            row.try_get::<Option<i64>, _>(column)
                .ok()
                .flatten()
                .unwrap_or(0)
                != 0
        };
        let text = |row: &sqlx::sqlite::SqliteRow, column: &str| {
            row.try_get::<Option<String>, _>(column).ok().flatten()
        };
        Ok(Some(Places::tally(
            queue,
            changes,
            rows.iter().map(|row| PlaceRow {
                paused: flag(row, "Paused"),
                id: text(row, "Id"),
                token: text(row, "LockToken"),
                queue: text(row, "Queue"),
                live: flag(row, "Live"),
            }),
        )))
    }

    async fn store_tokens(&mut self, queue: &str, tokens: f64, advance: f64) -> Result<()> {
        let sql = format!(
            r#"UPDATE {} SET "RateTokens" = ?2,
                   "RateCheckedAt" = CASE WHEN "RateCheckedAt" IS NULL THEN {NOW}
                       ELSE strftime('%Y-%m-%dT%H:%M:%fZ', "RateCheckedAt", ?3) END,
                   "UpdatedAt" = {NOW}
               WHERE "Queue" = ?1"#,
            self.q
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(queue)
            .bind(tokens)
            .bind(offset(advance))
            .execute(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        Ok(())
    }
}

impl SqliteDriver {
    /// See [`crate::engine::QueueOps::command_claim_limited`].
    pub(super) async fn claim_limited(
        &self,
        params: &LimitedClaimParams<'_>,
    ) -> Result<LimitedClaim> {
        let version = self.schema_version().await?;
        if version < 4 {
            return Err(limits::needs_schema_v4(&self.table, version));
        }
        let columns = self.columns().await?;
        let (_turn, mut conn) = self.write_turn("claiming under the queue's limits").await?;
        let q = self.table.queues().quoted(Engine::Sqlite);
        {
            let mut look = Tx {
                driver: self,
                conn: &mut conn,
                q: q.clone(),
                columns,
            };
            if limits::full_before_claim(&mut look, params).await? {
                self.warm.keep(conn, &self.pool);
                return Ok(LimitedClaim {
                    held: Some(limits::Held::Concurrency),
                    ..LimitedClaim::default()
                });
            }
        }
        let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE")
            .await
            .map_err(Error::db(ctx(self)))?;
        let claimed = {
            let mut steps = Tx {
                driver: self,
                conn: &mut tx,
                q,
                columns,
            };
            limits::claim_in(&mut steps, params).await?
        };
        tx.commit().await.map_err(Error::db(ctx(self)))?;
        self.warm.keep(conn, &self.pool);
        Ok(claimed)
    }
}

#[cfg(test)]
mod tests {
    //! The hand-on's read on a real SQLite file.

    use super::*;
    use crate::ConnectOptions;
    use crate::command::LeaseToken;
    use crate::engine::limits::testing::{places, seen};
    use crate::ident::TableName;

    /// Only rows of the queue whose lease, under the change's token, outlives the margin
    /// give their places back; the queue's pause is read beside them.
    #[tokio::test]
    async fn a_hand_on_counts_the_live_leases_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("q.db").display());
        let table = TableName::parse("HandOn").unwrap();
        let driver = SqliteDriver::connect(&url, &table, &ConnectOptions::default())
            .await
            .unwrap();
        let mut conn = driver.pool.acquire().await.unwrap();
        let ddl = crate::schema::render(Engine::Sqlite, &table);
        sqlx::raw_sql(AssertSqlSafe(format!("{}\n{}", ddl.down, ddl.up)))
            .execute(&mut *conn)
            .await
            .unwrap();
        let t = driver.t.clone();
        let token = LeaseToken::new();
        // a: live for 20 s; b: for 5 s; c: another queue.
        let mut ids = Vec::new();
        for (n, (queue, live)) in [("q", 20.0), ("q", 5.0), ("other", 20.0)]
            .into_iter()
            .enumerate()
        {
            let id = format!("hand-on-{n}");
            sqlx::query(AssertSqlSafe(format!(
                r#"INSERT INTO {t} ("Id", "Type", "Payload", "Queue", "LockToken", "LockedUntil")
                   VALUES (?1, 'work', '{{}}', ?2, ?3, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?4))"#
            )))
            .bind(&id)
            .bind(queue)
            .bind(token.to_string())
            .bind(offset(live))
            .execute(&mut *conn)
            .await
            .unwrap();
            ids.push(id);
        }
        let q = table.queues().quoted(Engine::Sqlite);
        let columns = driver.columns().await.unwrap();
        let mut tx = Tx {
            driver: &driver,
            conn: &mut conn,
            q: q.clone(),
            columns,
        };
        assert_eq!(places(&mut tx, "q", &ids, token).await, seen(1, false));
        let stranger = LeaseToken::new();
        assert_eq!(
            places(&mut tx, "q", &ids[..1], stranger).await,
            seen(0, false)
        );
        sqlx::query(AssertSqlSafe(format!(
            r#"INSERT INTO {q} ("Queue", "Paused") VALUES ('q', 1)"#
        )))
        .execute(&mut *tx.conn)
        .await
        .unwrap();
        assert_eq!(places(&mut tx, "q", &ids[..1], token).await, seen(1, true));
    }
}
