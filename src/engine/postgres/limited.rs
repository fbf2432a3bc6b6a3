//! PostgreSQL's limited claim ([`crate::engine::limits`]): one transaction that stamps,
//! locks the queue's row of `<table>Queues` with `SELECT … FOR UPDATE`, counts, locks the
//! candidates `FOR UPDATE SKIP LOCKED`, leases the ones the limits allow and takes the
//! tokens. Every statement reads committed data as of its own start (READ COMMITTED), so
//! once the queue's row is locked the counts include every earlier limited claim's leases.

use std::collections::HashMap;

use sqlx::{AssertSqlSafe, PgConnection, Row};
use uuid::Uuid;

use super::{PgDriver, StampArrays, WORK_BEGIN};
use crate::engine::Lifecycle;
use crate::engine::limits::{self, Candidates, LimitedTx, PlaceRow, Places, QueueRow};
use crate::engine::{ClaimParams, ClaimedRow, LimitedClaim, LimitedClaimParams, SetState};
use crate::error::{Error, Result};
use crate::ident::Engine;

/// The pending rows' condition.
const PENDING: &str = r#""ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#;

/// The queue's due rows in claim order, locked, skipping rows other claims hold: `$1`
/// queue, `$2` processing delay, `$3` types (NULL: every type), `$4` keys to leave out,
/// `$5` ids to leave out, `$6` limit. Ordered keys hold here as in any claim.
fn candidates_sql(t: &str) -> String {
    format!(
        r#"SELECT "Id", "ConcurrencyKey" FROM {t}
           WHERE "Queue" = $1 AND {PENDING}
             AND "RunAt" <= now()
             AND ("LockedUntil" IS NULL OR "LockedUntil" <= now())
             AND ("CreatedAt" <= now() - make_interval(secs => $2) OR "CreatedAt" IS NULL)
             AND ($3::text[] IS NULL OR "Type" = ANY($3))
             AND ("ConcurrencyKey" IS NULL OR NOT ("ConcurrencyKey" = ANY($4::text[])))
             AND NOT ("Id" = ANY($5::uuid[])){ordered}
           ORDER BY "Priority", "RunAt", "Id"
           LIMIT $6
           FOR UPDATE SKIP LOCKED"#,
        ordered = super::ordered_filter(t)
    )
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Binds [`candidates_sql`]'s `$1..$6`.
fn bind_candidates<'q>(query: PgQuery<'q>, which: &Candidates<'_>) -> PgQuery<'q> {
    let except: Vec<Uuid> = which
        .except_ids
        .iter()
        .filter_map(|id| Uuid::parse_str(id).ok())
        .collect();
    query
        .bind(which.queue.to_owned())
        .bind(which.claim.processing_delay.as_secs_f64())
        .bind(which.claim.types.as_deref().map(<[String]>::to_vec))
        .bind(which.except_keys.to_vec())
        .bind(except)
        .bind(i64::from(which.limit))
}

struct Tx<'a> {
    driver: &'a PgDriver,
    conn: &'a mut PgConnection,
    q: String,
}

impl Tx<'_> {
    fn db(&self) -> impl FnOnce(sqlx::Error) -> Error + '_ {
        self.driver.db("claiming under the queue's limits")
    }

    /// Runs the version-4 set-state statement `sql` with the arrays of `changes`; the
    /// count of rows it stamped.
    async fn stamp_with(&mut self, sql: &std::sync::Arc<str>, changes: &[SetState]) -> Result<u64> {
        let query = sqlx::query_scalar(AssertSqlSafe(sql.clone()));
        let query = StampArrays::new(changes, self.driver.ascii_errors(), true).bind_scalar(query);
        let n: i64 = query
            .fetch_one(&mut *self.conn)
            .await
            .map_err(self.driver.db("stamping outcomes"))?;
        Ok(n.max(0) as u64)
    }
}

#[async_trait::async_trait]
impl LimitedTx for Tx<'_> {
    async fn read_queue(&mut self, queue: &str) -> Result<Option<QueueRow>> {
        let sql = format!(
            r#"SELECT "Paused", "RateTokens",
                      EXTRACT(EPOCH FROM now() - "RateCheckedAt")::float8 AS "Elapsed"
               FROM {} WHERE "Queue" = $1 FOR UPDATE"#,
            self.q
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(queue)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(self.db())?;
        Ok(row.map(|row| QueueRow {
            paused: row
                .try_get::<Option<bool>, _>("Paused")
                .ok()
                .flatten()
                .unwrap_or(false),
            tokens: row.try_get("RateTokens").ok().flatten(),
            elapsed: row.try_get("Elapsed").ok().flatten(),
        }))
    }

    async fn insert_queue(&mut self, queue: &str) -> Result<()> {
        let sql = format!(
            r#"INSERT INTO {} ("Queue") VALUES ($1) ON CONFLICT ("Queue") DO NOTHING"#,
            self.q
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(queue)
            .execute(&mut *self.conn)
            .await
            .map_err(self.db())?;
        Ok(())
    }

    async fn stamp(&mut self, changes: &[SetState]) -> Result<u64> {
        // Limited claims need a version-4 table: the moves to history carry its columns.
        let sql = self.driver.sql.set_state(4);
        let mut stamped = self.stamp_with(&sql.first, changes).await?;
        // The first form may fall short of a row updated meanwhile (see `Lookup`).
        if stamped < super::stampable(changes) {
            stamped += self.stamp_with(&sql.again, changes).await?;
        }
        Ok(stamped)
    }

    async fn running(&mut self, queue: &str) -> Result<u64> {
        let sql = format!(
            r#"SELECT count(*) FROM {} WHERE "Queue" = $1 AND {PENDING} AND "LockedUntil" > now()"#,
            self.driver.t
        );
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(queue)
            .fetch_one(&mut *self.conn)
            .await
            .map_err(self.db())?;
        Ok(n.max(0) as u64)
    }

    async fn candidates(
        &mut self,
        which: &Candidates<'_>,
    ) -> Result<Vec<(String, Option<String>)>> {
        let sql = candidates_sql(&self.driver.t);
        let rows = bind_candidates(sqlx::query(AssertSqlSafe(sql)), which)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(self.db())?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let id: Uuid = row.try_get("Id").ok()?;
                let key: Option<String> = row.try_get("ConcurrencyKey").ok().flatten();
                Some((id.to_string(), key))
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
               WHERE "ConcurrencyKey" = ANY($2) AND {PENDING} AND "LockedUntil" > now()
                 AND "Queue" = $1
               GROUP BY 1"#,
            self.driver.t
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(queue)
            .bind(keys.to_vec())
            .fetch_all(&mut *self.conn)
            .await
            .map_err(self.db())?;
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
            r#"UPDATE {} AS c
               SET "LockToken" = $1, "LockedUntil" = now() + make_interval(secs => $2),
                   "Attempts" = CASE WHEN c."Attempts" BETWEEN 0 AND 2147483646
                                     THEN c."Attempts" + 1 ELSE c."Attempts" END
               WHERE c."Id" = ANY($3::uuid[])
               RETURNING c.*"#,
            self.driver.t
        );
        let ids: Vec<Uuid> = ids
            .iter()
            .filter_map(|id| Uuid::parse_str(id).ok())
            .collect();
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(claim.token.0)
            .bind(claim.lease.as_secs_f64())
            .bind(ids)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(self.db())?;
        Ok(self.driver.claimed(&rows, claim))
    }

    async fn claim_free(&mut self, which: &Candidates<'_>) -> Result<Vec<ClaimedRow>> {
        let t = &self.driver.t;
        let sql = format!(
            r#"WITH c AS ({})
               UPDATE {t} AS x
               SET "LockToken" = $7, "LockedUntil" = now() + make_interval(secs => $8),
                   "Attempts" = CASE WHEN x."Attempts" BETWEEN 0 AND 2147483646
                                     THEN x."Attempts" + 1 ELSE x."Attempts" END
               WHERE x."Id" = ANY(ARRAY(SELECT "Id" FROM c))
               RETURNING x.*"#,
            candidates_sql(t)
        );
        let rows = bind_candidates(sqlx::query(AssertSqlSafe(sql)), which)
            .bind(which.claim.token.0)
            .bind(which.claim.lease.as_secs_f64())
            .fetch_all(&mut *self.conn)
            .await
            .map_err(self.db())?;
        Ok(self.driver.claimed(&rows, which.claim))
    }

    async fn places_to_hand_on(
        &mut self,
        queue: &str,
        changes: &[SetState],
        margin: std::time::Duration,
    ) -> Result<Option<Places>> {
        let sql = format!(
            r#"SELECT c."Id", c."LockToken", c."Queue",
                      (c."ProcessedAt" IS NULL AND c."DeadLetteredAt" IS NULL
                       AND c."LockedUntil" > now() + make_interval(secs => $3)) AS "Live",
                      q."Paused"
               FROM {} AS q LEFT JOIN {} AS c ON c."Id" = ANY($2::uuid[])
               WHERE q."Queue" = $1
               FOR SHARE OF q"#,
            self.q, self.driver.t
        );
        let ids: Vec<Uuid> = changes
            .iter()
            .filter_map(|change| change.lease.id.as_uuid())
            .collect();
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(queue)
            .bind(ids)
            .bind(margin.as_secs_f64())
            .fetch_all(&mut *self.conn)
            .await
            .map_err(self.db())?;
        let uuid = |row: &sqlx::postgres::PgRow, column: &str| {
            row.try_get::<Option<Uuid>, _>(column)
                .ok()
                .flatten()
                .map(|u| u.to_string())
        };
        let flag = |row: &sqlx::postgres::PgRow, column: &str| {
            row.try_get::<Option<bool>, _>(column).ok().flatten() == Some(true)
        };
        Ok(Some(Places::tally(
            queue,
            changes,
            rows.iter().map(|row| PlaceRow {
                paused: flag(row, "Paused"),
                id: uuid(row, "Id"),
                token: uuid(row, "LockToken"),
                queue: row.try_get::<Option<String>, _>("Queue").ok().flatten(),
                live: flag(row, "Live"),
            }),
        )))
    }

    async fn store_tokens(&mut self, queue: &str, tokens: f64, advance: f64) -> Result<()> {
        let sql = format!(
            r#"UPDATE {} SET "RateTokens" = $2,
                   "RateCheckedAt" = COALESCE("RateCheckedAt" + make_interval(secs => $3), now()),
                   "UpdatedAt" = now()
               WHERE "Queue" = $1"#,
            self.q
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(queue)
            .bind(tokens)
            .bind(advance)
            .execute(&mut *self.conn)
            .await
            .map_err(self.db())?;
        Ok(())
    }
}

impl PgDriver {
    /// See [`crate::engine::QueueOps::command_claim_limited`].
    pub(super) async fn claim_limited(
        &self,
        params: &LimitedClaimParams<'_>,
    ) -> Result<LimitedClaim> {
        let version = self.schema_version().await?;
        if version < 4 {
            return Err(limits::needs_schema_v4(&self.table, version));
        }
        let ctx = "claiming under the queue's limits";
        let q = self.table.queues().quoted(Engine::Postgres);
        {
            let mut conn = self.work.acquire().await.map_err(self.db(ctx))?;
            let mut look = Tx {
                driver: self,
                conn: &mut conn,
                q: q.clone(),
            };
            if limits::full_before_claim(&mut look, params).await? {
                return Ok(LimitedClaim {
                    held: Some(limits::Held::Concurrency),
                    ..LimitedClaim::default()
                });
            }
        }
        let mut tx = self
            .work
            .begin_with(WORK_BEGIN)
            .await
            .map_err(self.db(ctx))?;
        let claimed = {
            let mut steps = Tx {
                driver: self,
                conn: &mut tx,
                q,
            };
            limits::claim_in(&mut steps, params).await?
        };
        tx.commit().await.map_err(self.db(ctx))?;
        Ok(claimed)
    }
}

#[cfg(all(test, feature = "driver-suite"))]
mod tests {
    //! The hand-on's read on a real PostgreSQL.

    use sqlx::Connection as _;

    use super::*;
    use crate::ConnectOptions;
    use crate::command::LeaseToken;
    use crate::engine::limits::testing::{assert_one_place, places, seen, stalled_hand_on};
    use crate::ident::TableName;

    /// A table of its own (`<tag>_<pid>`), created afresh, an admin connection, a driver on
    /// it and its DDL (to drop it after).
    struct Fresh {
        url: String,
        table: TableName,
        admin: sqlx::PgConnection,
        driver: PgDriver,
        ddl: crate::schema::Ddl,
    }

    async fn fresh(tag: &str) -> Fresh {
        let url = std::env::var("ICQ_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let table = TableName::parse(&format!("{tag}_{}", std::process::id())).unwrap();
        let mut admin = sqlx::PgConnection::connect(&url).await.expect("PostgreSQL");
        let ddl = crate::schema::render(Engine::Postgres, &table);
        sqlx::raw_sql(AssertSqlSafe(format!("{}\n{}", ddl.down, ddl.up)))
            .execute(&mut admin)
            .await
            .unwrap();
        let driver = PgDriver::connect(&url, &table, &ConnectOptions::default())
            .await
            .expect("driver");
        Fresh {
            url,
            table,
            admin,
            driver,
            ddl,
        }
    }

    /// Only rows of the queue whose lease, under the change's token, outlives the margin
    /// give their places back; the queue's pause is read beside them.
    #[tokio::test]
    async fn a_hand_on_counts_the_live_leases_it_ends() {
        let Fresh {
            table,
            mut admin,
            driver,
            ddl,
            ..
        } = fresh("icq_hand_on").await;
        let t = driver.t.clone();
        let token = LeaseToken::new();
        // a: live for 20 s; b: for 5 s; c: another queue.
        let mut ids = Vec::new();
        for (queue, live) in [("q", 20), ("q", 5), ("other", 20)] {
            let id: Uuid = sqlx::query_scalar(AssertSqlSafe(format!(
                r#"INSERT INTO {t} ("Type", "Payload", "Queue", "LockToken", "LockedUntil")
                   VALUES ('work', '{{}}', $1, $2, now() + make_interval(secs => $3))
                   RETURNING "Id""#
            )))
            .bind(queue)
            .bind(token.0)
            .bind(f64::from(live))
            .fetch_one(&mut admin)
            .await
            .unwrap();
            ids.push(id.to_string());
        }
        let q = table.queues().quoted(Engine::Postgres);
        let mut conn = driver.work.acquire().await.unwrap();
        let mut tx = Tx {
            driver: &driver,
            conn: &mut conn,
            q: q.clone(),
        };
        // A queue without its row of `<table>Queues` gives back no place.
        assert_eq!(
            places(&mut tx, "other", &ids[2..], token).await,
            seen(0, false)
        );
        sqlx::query(AssertSqlSafe(format!(
            r#"INSERT INTO {q} ("Queue", "Paused") VALUES ('q', false)"#
        )))
        .execute(&mut admin)
        .await
        .unwrap();
        assert_eq!(places(&mut tx, "q", &ids, token).await, seen(1, false));
        let stranger = LeaseToken::new();
        assert_eq!(
            places(&mut tx, "q", &ids[..1], stranger).await,
            seen(0, false)
        );
        sqlx::query(AssertSqlSafe(format!(
            r#"UPDATE {q} SET "Paused" = true WHERE "Queue" = 'q'"#
        )))
        .execute(&mut admin)
        .await
        .unwrap();
        assert_eq!(places(&mut tx, "q", &ids[..1], token).await, seen(1, true));
        drop(conn);
        sqlx::raw_sql(AssertSqlSafe(ddl.down))
            .execute(&mut admin)
            .await
            .unwrap();
    }

    /// A hand-on whose stamp waits on a row lock until its lease has lapsed keeps a
    /// counting claim out meanwhile (the queue's row in share mode), so the two never
    /// lease more than the limit together.
    #[tokio::test]
    async fn a_stalled_hand_on_keeps_the_count_out_until_it_commits() {
        let Fresh {
            url,
            table,
            mut admin,
            driver,
            ddl,
        } = fresh("icq_stalled").await;
        let driver = std::sync::Arc::new(driver);
        let (t, q) = (driver.t.clone(), table.queues().quoted(Engine::Postgres));
        let held_by = LeaseToken::new();
        // R1: leased for 1.3 s more (the margin of a 2 s lease is 1 s); three rows due.
        let r1: Uuid = sqlx::query_scalar(AssertSqlSafe(format!(
            r#"INSERT INTO {t} ("Type", "Payload", "Queue", "LockToken", "LockedUntil", "RunAt")
               VALUES ('work', '{{}}', 'q', $1, now() + interval '1.3 s', now() - interval '1 h')
               RETURNING "Id""#
        )))
        .bind(held_by.0)
        .fetch_one(&mut admin)
        .await
        .unwrap();
        sqlx::raw_sql(AssertSqlSafe(format!(
            r#"INSERT INTO {t} ("Type", "Payload", "Queue") VALUES ('work', '{{}}', 'q'),
                   ('work', '{{}}', 'q'), ('work', '{{}}', 'q');
               INSERT INTO {q} ("Queue") VALUES ('q')"#
        )))
        .execute(&mut admin)
        .await
        .unwrap();
        // Another session holds R1's row (an operator's tool, an abandoned statement).
        let mut blocker = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::raw_sql(AssertSqlSafe(format!(
            r#"BEGIN; SELECT 1 FROM {t} WHERE "Id" = '{r1}' FOR SHARE"#
        )))
        .execute(&mut blocker)
        .await
        .unwrap();
        let release = async {
            sqlx::raw_sql("COMMIT").execute(&mut blocker).await.unwrap();
        };
        let (handed, counted) = stalled_hand_on(driver, &r1.to_string(), held_by, release).await;
        let live: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            r#"SELECT count(*) FROM {t} WHERE "Queue" = 'q' AND "ProcessedAt" IS NULL
                 AND "DeadLetteredAt" IS NULL AND "LockedUntil" > now()"#
        )))
        .fetch_one(&mut admin)
        .await
        .unwrap();
        sqlx::raw_sql(AssertSqlSafe(ddl.down))
            .execute(&mut admin)
            .await
            .unwrap();
        assert_one_place(&handed, &counted, live);
    }
}
