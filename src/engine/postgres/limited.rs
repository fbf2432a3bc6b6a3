//! PostgreSQL's limited claim ([`crate::engine::limits`]): one transaction that stamps,
//! locks the queue's row of `<table>Queues` with `SELECT … FOR UPDATE`, counts, locks the
//! candidates `FOR UPDATE SKIP LOCKED`, leases the ones the limits allow and takes the
//! tokens. Every statement reads committed data as of its own start (READ COMMITTED), so
//! once the queue's row is locked the counts include every earlier limited claim's leases.
//!
//! A hand-on is one statement of its own instead ([`hand_on_sql`]): with handlers that do
//! work, a limited queue's place stands empty from one command's end to the next one's
//! lease, so the hand-on's round trips are paid by every command the limit admits.

use std::collections::HashMap;

use sqlx::{AssertSqlSafe, PgConnection, Row};
use uuid::Uuid;

use super::{PgDriver, StampArrays, WORK_BEGIN};
use crate::engine::Lifecycle;
use crate::engine::limits::{self, Candidates, LimitedTx, QueueRow};
use crate::engine::{ClaimParams, ClaimedRow, LimitedClaim, LimitedClaimParams, SetState};
use crate::error::{Error, Result};
use crate::ident::Engine;

/// The pending rows' condition.
const PENDING: &str = r#""ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#;

/// The queue's due rows in claim order, locked, skipping rows other claims hold: `$1`
/// queue, `$2` processing delay, `$3` types (NULL: every type), `$4` keys to leave out,
/// `$5` ids to leave out, `$6` limit. Ordered keys hold here as in any claim. A `gate`
/// (`AND …`, or empty) locks nothing unless its condition holds.
fn candidates_sql(t: &str, gate: &str) -> String {
    format!(
        r#"SELECT "Id", "ConcurrencyKey" FROM {t}
           WHERE "Queue" = $1 AND {PENDING}
             AND "RunAt" <= now()
             AND ("LockedUntil" IS NULL OR "LockedUntil" <= now())
             AND ("CreatedAt" <= now() - make_interval(secs => $2) OR "CreatedAt" IS NULL)
             AND ($3::text[] IS NULL OR "Type" = ANY($3))
             AND ("ConcurrencyKey" IS NULL OR NOT ("ConcurrencyKey" = ANY($4::text[])))
             AND NOT ("Id" = ANY($5::uuid[])){ordered}{gate}
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

/// Leases the rows of the CTE `cand` as a claim does: `$7` token, `$8` lease seconds.
fn lease_candidates_sql(t: &str) -> String {
    format!(
        r#"UPDATE {t} AS x
           SET "LockToken" = $7, "LockedUntil" = now() + make_interval(secs => $8),
               "Attempts" = CASE WHEN x."Attempts" BETWEEN 0 AND 2147483646
                                 THEN x."Attempts" + 1 ELSE x."Attempts" END
           WHERE x."Id" = ANY(ARRAY(SELECT "Id" FROM cand))
           RETURNING x.*"#
    )
}

/// A hand-on in one statement, its own transaction: it holds the queue's row of `q` in
/// share mode, reads the places the stamps give back, writes the stamps only when every
/// one ends a live lease of the queue and it is not paused, and leases candidates in
/// their places only when every stamp landed. It does not wait for the queue's row
/// (`NOWAIT`): another claim holding it (a counting claim, a pause) fails the statement
/// before it writes, and the claim takes the lock in a transaction instead. A statement
/// outside a transaction whose caller gave up waiting would still commit once the lock
/// came, its outcomes and leases reported to nobody. Leases are judged live by the clock
/// once the row is held, not the statement's start. `$1..$8` as [`candidates_sql`] and
/// [`lease_candidates_sql`] (the limit is at most the stamps), `$9..$14` the version-4
/// stamp arrays, `$15` the margin in seconds, `$16` how many outcomes the claim carries.
///
/// The places are read by primary key alone (queue, state, lease and token judged on the
/// rows read: with them in the condition, a table not yet analyzed was read through a
/// poll index, every pending row), the queue compared byte for byte whatever the
/// column's collation. The whole statement reads one snapshot, taken before any wait (on
/// a stamped row another session holds): a candidate another claim leased meanwhile is
/// read again at its newest version by `FOR UPDATE`, found leased and skipped. One row comes back, with
/// NULL table columns when nothing was leased; none when the queue has no row yet (the
/// counting claim inserts it).
fn hand_on_sql(t: &str, h: &str, q: &str) -> String {
    let stamps = super::stamp_move_ctes(
        t,
        h,
        9,
        4,
        super::Lookup::Lateral,
        "\n                 WHERE EXISTS (SELECT 1 FROM ok)",
    );
    format!(
        r#"WITH queue AS MATERIALIZED (
               SELECT coalesce("Paused", false) AS paused FROM {q} WHERE "Queue" = $1
               FOR SHARE NOWAIT),
           places AS MATERIALIZED (
               SELECT queue.paused, (
                   SELECT count(*) FILTER (
                       WHERE c."ProcessedAt" IS NULL AND c."DeadLetteredAt" IS NULL
                         AND c."LockedUntil" > clock_timestamp() + make_interval(secs => $15)
                         AND c."Queue" COLLATE "C" = $1 COLLATE "C"
                         AND c."LockToken" = ($10::uuid[])[array_position($9::uuid[], c."Id")])
                   FROM {t} AS c WHERE c."Id" = ANY($9::uuid[])) AS live
               FROM queue),
           ok AS MATERIALIZED (SELECT 1 FROM places WHERE NOT paused AND live = $16),
           {stamps},
           cand AS ({}),
           claimed AS ({})
           SELECT p.paused AS "icq_paused", p.live AS "icq_live",
                  n.stamped AS "icq_stamped", claimed.*
           FROM places AS p CROSS JOIN (SELECT count(*) AS stamped FROM stamped) AS n
                LEFT JOIN claimed ON true"#,
        candidates_sql(
            t,
            "\n             AND EXISTS (SELECT 1 FROM ok)\n             \
             AND (SELECT count(*) FROM stamped) = $16"
        ),
        lease_candidates_sql(t)
    )
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
        let sql = candidates_sql(&self.driver.t, "");
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
            "WITH cand AS ({}) {}",
            candidates_sql(t, ""),
            lease_candidates_sql(t)
        );
        let rows = bind_candidates(sqlx::query(AssertSqlSafe(sql)), which)
            .bind(which.claim.token.0)
            .bind(which.claim.lease.as_secs_f64())
            .fetch_all(&mut *self.conn)
            .await
            .map_err(self.db())?;
        Ok(self.driver.claimed(&rows, which.claim))
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
        if let Some([queue]) = params.claim.queues.as_deref()
            && let Some(ask) = limits::hand_on_ask(params, queue)
            && let Some(claimed) = self.hand_on(&ask, params.claim).await?
        {
            return Ok(claimed);
        }
        // Declined, or no hand-on: the claim takes the queue's lock.
        let params = &LimitedClaimParams {
            hand_on: false,
            ..*params
        };
        let ctx = "claiming under the queue's limits";
        let q = self.table.queues().quoted(Engine::Postgres);
        if params.changes.is_empty() {
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

    /// The hand-on of `ask` in one statement ([`hand_on_sql`]); `None` when it declined
    /// (nothing was written). Stamps the first form fell short of (a row updated after
    /// the statement's snapshot) are written by the second form after it; the places are
    /// then left to the next counting claim.
    async fn hand_on(
        &self,
        ask: &limits::HandOn<'_>,
        claim: &ClaimParams,
    ) -> Result<Option<LimitedClaim>> {
        let which = &ask.which;
        let sql = self.sql.hand_on.get_or_init(|| {
            let q = self.table.queues().quoted(Engine::Postgres);
            hand_on_sql(&self.t, &self.h, &q).into()
        });
        let query = bind_candidates(sqlx::query(AssertSqlSafe(sql.clone())), which)
            .bind(claim.token.0)
            .bind(claim.lease.as_secs_f64());
        let query = StampArrays::new(ask.changes, self.ascii_errors(), true)
            .bind(query)
            .bind(ask.margin.as_secs_f64())
            .bind(ask.changes.len() as i64);
        let ctx = "handing places on under the queue's limit";
        let rows = match on_work!(self, |e| query.fetch_all(e)).await {
            Ok(rows) => rows,
            // The queue's row is another claim's (`NOWAIT`): nothing was written.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => {
                return Ok(None);
            }
            Err(err) => return Err(self.db(ctx)(err)),
        };
        let Some(first) = rows.first() else {
            // The queue has no row yet: nothing was written.
            return Ok(None);
        };
        // Read strictly: the statement may have written, so no unreadable answer may pass
        // for a decline.
        let number = |column: &str| first.try_get::<i64, _>(column).map_err(self.db(ctx));
        let places = limits::Places {
            live: number("icq_live")?.max(0) as u64,
            paused: first
                .try_get::<bool, _>("icq_paused")
                .map_err(self.db(ctx))?,
        };
        if !ask.may_stamp(places) {
            return Ok(None);
        }
        let first_form = number("icq_stamped")?.max(0) as u64;
        // Should the second form fail, so does the call, though the first committed: the
        // outcomes go back to be stamped again (those stamped find no lease), where
        // answering would drop the ones still unstamped.
        let stamped = self.stamp_rest(ask.changes, 4, first_form).await?;
        if first_form < places.live {
            // Nothing was leased: the places are left to the next counting claim.
            return Ok(Some(LimitedClaim {
                stamped,
                rows: Vec::new(),
                held: Some(limits::Held::Concurrency),
            }));
        }
        let leased: Vec<sqlx::postgres::PgRow> = rows
            .into_iter()
            .filter(|row| matches!(row.try_get::<Option<Uuid>, _>("Id"), Ok(Some(_))))
            .collect();
        let rows = self.claimed(&leased, claim);
        Ok(Some(limits::handed_on(ask, claim, places, stamped, rows)))
    }
}

#[cfg(all(test, feature = "driver-suite"))]
mod tests {
    //! The hand-on on a real PostgreSQL.

    use sqlx::Connection as _;

    use super::*;
    use crate::ConnectOptions;
    use crate::command::LeaseToken;
    use crate::engine::limits::testing::{
        assert_lapsed_place_kept, assert_one_place, completed, hand_on_behind_a_count,
        hand_on_claim, stalled_hand_on,
    };
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

    /// A hand-on of `changes` in queue `q` with a 20 s lease (a margin of 10 s): what the
    /// one statement answered (`None`: declined).
    async fn hand_on_of(driver: &PgDriver, changes: &[SetState]) -> Option<LimitedClaim> {
        let (claim, limits) = hand_on_claim();
        let params = LimitedClaimParams {
            claim: &claim,
            limits: &limits,
            changes,
            hand_on: true,
        };
        let ask = limits::hand_on_ask(&params, "q").expect("a hand-on applies");
        driver.hand_on(&ask, &claim).await.unwrap()
    }

    /// The live leases of the table `t`.
    async fn leased(admin: &mut sqlx::PgConnection, t: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            r#"SELECT count(*) FROM {t} WHERE "LockedUntil" > now() AND "ProcessedAt" IS NULL"#
        )))
        .fetch_one(admin)
        .await
        .unwrap()
    }

    /// The hand-on stamps and leases only when every row it stamps is a pending row of the
    /// queue leased under the change's token past the margin and the queue is not
    /// paused; otherwise it writes nothing. When it does, it leases as many due rows as
    /// it ended leases, in the same statement.
    #[tokio::test]
    async fn a_hand_on_fills_only_the_live_places_it_ends() {
        let Fresh {
            url,
            table,
            mut admin,
            driver,
            ddl,
        } = fresh("icq_hand_on").await;
        let t = driver.t.clone();
        let token = LeaseToken::new();
        // a: live for 30 s; b: for 5 s; c: another queue; then two rows due.
        let mut ids = Vec::new();
        for (queue, live) in [("q", 30), ("q", 5), ("other", 30)] {
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
        sqlx::raw_sql(AssertSqlSafe(format!(
            r#"INSERT INTO {t} ("Type", "Payload", "Queue") VALUES ('work', '{{}}', 'q'),
                   ('work', '{{}}', 'q')"#
        )))
        .execute(&mut admin)
        .await
        .unwrap();
        let of = |id: &str, token| completed(id, token);
        // A queue without its row of `<table>Queues` gives back no place.
        assert!(hand_on_of(&driver, &[of(&ids[0], token)]).await.is_none());
        let q = table.queues().quoted(Engine::Postgres);
        sqlx::query(AssertSqlSafe(format!(
            r#"INSERT INTO {q} ("Queue", "Paused") VALUES ('q', false)"#
        )))
        .execute(&mut admin)
        .await
        .unwrap();
        // A lease shorter than the margin, another queue's row, another token: declined.
        let declined: [Vec<SetState>; 3] = [
            vec![of(&ids[0], token), of(&ids[1], token)],
            vec![of(&ids[0], token), of(&ids[2], token)],
            vec![of(&ids[0], LeaseToken::new())],
        ];
        for changes in &declined {
            assert!(hand_on_of(&driver, changes).await.is_none());
        }
        assert_eq!(leased(&mut admin, &t).await, 3, "nothing was stamped");
        sqlx::query(AssertSqlSafe(format!(
            r#"UPDATE {q} SET "Paused" = true WHERE "Queue" = 'q'"#
        )))
        .execute(&mut admin)
        .await
        .unwrap();
        assert!(hand_on_of(&driver, &[of(&ids[0], token)]).await.is_none());
        sqlx::query(AssertSqlSafe(format!(
            r#"UPDATE {q} SET "Paused" = false WHERE "Queue" = 'q'"#
        )))
        .execute(&mut admin)
        .await
        .unwrap();
        // Another claim holds the queue's row: declined at once, nothing written.
        let mut counting = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::raw_sql(AssertSqlSafe(format!(
            r#"BEGIN; SELECT 1 FROM {q} WHERE "Queue" = 'q' FOR UPDATE"#
        )))
        .execute(&mut counting)
        .await
        .unwrap();
        let declined = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            hand_on_of(&driver, &[of(&ids[0], token)]),
        )
        .await
        .expect("the hand-on does not wait for the queue's row");
        assert!(declined.is_none());
        assert_eq!(leased(&mut admin, &t).await, 3, "nothing was stamped");
        sqlx::raw_sql("COMMIT")
            .execute(&mut counting)
            .await
            .unwrap();
        let handed = hand_on_of(&driver, &[of(&ids[0], token)])
            .await
            .expect("handed on");
        assert_eq!(handed.stamped, 1);
        assert_eq!(handed.rows.len(), 1, "one place ended, one row leased");
        assert_ne!(handed.rows[0].lease.id.as_str(), ids[0]);
        assert_eq!(handed.held, Some(limits::Held::Concurrency));
        assert_eq!(
            leased(&mut admin, &t).await,
            3,
            "one lease ended, one began"
        );
        let moved: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            r#"SELECT count(*) FROM {} WHERE "Id" = $1 AND "ProcessedAt" IS NOT NULL"#,
            driver.h
        )))
        .bind(Uuid::parse_str(&ids[0]).unwrap())
        .fetch_one(&mut admin)
        .await
        .unwrap();
        assert_eq!(moved, 1, "the completed row is in history");
        sqlx::raw_sql(AssertSqlSafe(ddl.down))
            .execute(&mut admin)
            .await
            .unwrap();
    }

    /// Queue `q` of the table `t` (queues `q_table`) with its row and R1, leased under
    /// `held_by` for 1.3 s more (the margin of a 2 s lease is 1 s), then `due` rows due:
    /// R1's id and theirs.
    async fn leased_and_due(
        admin: &mut sqlx::PgConnection,
        t: &str,
        q_table: &str,
        held_by: LeaseToken,
        due: usize,
    ) -> (Uuid, Vec<Uuid>) {
        let r1: Uuid = sqlx::query_scalar(AssertSqlSafe(format!(
            r#"INSERT INTO {t} ("Type", "Payload", "Queue", "LockToken", "LockedUntil", "RunAt")
               VALUES ('work', '{{}}', 'q', $1, now() + interval '1.3 s', now() - interval '1 h')
               RETURNING "Id""#
        )))
        .bind(held_by.0)
        .fetch_one(&mut *admin)
        .await
        .unwrap();
        let mut ids = Vec::new();
        for _ in 0..due {
            let id: Uuid = sqlx::query_scalar(AssertSqlSafe(format!(
                r#"INSERT INTO {t} ("Type", "Payload", "Queue") VALUES ('work', '{{}}', 'q')
                   RETURNING "Id""#
            )))
            .fetch_one(&mut *admin)
            .await
            .unwrap();
            ids.push(id);
        }
        sqlx::query(AssertSqlSafe(format!(
            r#"INSERT INTO {q_table} ("Queue") VALUES ('q')"#
        )))
        .execute(&mut *admin)
        .await
        .unwrap();
        (r1, ids)
    }

    /// The live leases of queue `q` in the table `t`.
    async fn live_in_q(admin: &mut sqlx::PgConnection, t: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            r#"SELECT count(*) FROM {t} WHERE "Queue" = 'q' AND "ProcessedAt" IS NULL
                 AND "DeadLetteredAt" IS NULL AND "LockedUntil" > now()"#
        )))
        .fetch_one(admin)
        .await
        .unwrap()
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
        let (r1, _) = leased_and_due(&mut admin, &t, &q, held_by, 3).await;
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
        let live = live_in_q(&mut admin, &t).await;
        sqlx::raw_sql(AssertSqlSafe(ddl.down))
            .execute(&mut admin)
            .await
            .unwrap();
        assert_one_place(&handed, &counted, live);
    }

    /// A lease that lapses while its hand-on would wait for the queue's row, held by a
    /// counting claim that fills the lapsed place, is not handed on: the hand-on does not
    /// wait (`NOWAIT`), and the claim counts once the row is free.
    #[tokio::test]
    async fn a_lease_that_lapses_behind_a_count_is_not_handed_on() {
        let Fresh {
            url,
            table,
            mut admin,
            driver,
            ddl,
        } = fresh("icq_lapsed").await;
        let driver = std::sync::Arc::new(driver);
        let (t, q) = (driver.t.clone(), table.queues().quoted(Engine::Postgres));
        let held_by = LeaseToken::new();
        let (r1, due) = leased_and_due(&mut admin, &t, &q, held_by, 2).await;
        let due = due[0];
        // The counting claim: it holds the queue's row, fills R1's place once R1 has
        // lapsed, and commits.
        let mut counting = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::raw_sql(AssertSqlSafe(format!(
            r#"BEGIN; SELECT 1 FROM {q} WHERE "Queue" = 'q' FOR UPDATE"#
        )))
        .execute(&mut counting)
        .await
        .unwrap();
        let fill = async {
            tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
            sqlx::raw_sql(AssertSqlSafe(format!(
                r#"UPDATE {t} SET "LockToken" = gen_random_uuid(),
                       "LockedUntil" = now() + interval '60 s'
                   WHERE "Id" = '{due}'; COMMIT"#
            )))
            .execute(&mut counting)
            .await
            .unwrap();
        };
        let handed = hand_on_behind_a_count(driver.clone(), &r1.to_string(), held_by, fill).await;
        let live = live_in_q(&mut admin, &t).await;
        sqlx::raw_sql(AssertSqlSafe(ddl.down))
            .execute(&mut admin)
            .await
            .unwrap();
        assert_lapsed_place_kept(&handed, live);
    }
}
