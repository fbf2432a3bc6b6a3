//! MySQL/MariaDB's limited claim ([`crate::engine::limits`]): one transaction that stamps,
//! locks the queue's row of `<table>Queues` with `SELECT … FOR UPDATE`, counts, locks the
//! candidates `FOR UPDATE SKIP LOCKED`, leases the ones the limits allow and takes the
//! tokens. icq's sessions run at READ COMMITTED, and the counts are the transaction's first
//! plain reads, taken after the queue's row is locked (under REPEATABLE READ that is when
//! the snapshot starts), so they include every earlier limited claim's leases.

use std::collections::HashMap;

use sqlx::{AssertSqlSafe, Connection, MySqlConnection, Row};

use super::{
    MySqlDriver, NOW, decode_row, exact, exact_marks, leased_as_updated, micros, payload_bytes,
};
use crate::engine::Lifecycle;
use crate::engine::limits::{self, Candidates, LimitedTx, PlaceRow, Places, QueueRow};
use crate::engine::{ClaimParams, ClaimedRow, LimitedClaim, LimitedClaimParams, SetState, marks};
use crate::error::{Error, Result};
use crate::ident::Engine;

/// The pending rows' condition.
const PENDING: &str = "`ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL";

/// How many times a limited claim runs when InnoDB makes it a deadlock's victim.
const DEADLOCK_TRIES: u32 = 3;

/// Whether `err` is InnoDB's deadlock (1213, SQLSTATE 40001): the transaction was rolled
/// back whole.
fn deadlocked(err: &Error) -> bool {
    match err {
        Error::Database {
            cause: sqlx::Error::Database(db),
            ..
        } => db.code().as_deref() == Some("40001"),
        _ => false,
    }
}

/// A row's `Paused` (a BOOLEAN is TINYINT(1): read as either).
fn paused_of(row: &sqlx::mysql::MySqlRow) -> bool {
    row.try_get::<Option<bool>, _>("Paused")
        .ok()
        .flatten()
        .or_else(|| {
            row.try_get::<Option<i64>, _>("Paused")
                .ok()
                .flatten()
                .map(|v| v != 0)
        })
        .unwrap_or(false)
}

/// The database's UTC clock when the expression is evaluated, not at the statement's
/// start as `UTC_TIMESTAMP()` is: the statement's UTC start moved on by the time since
/// (`SYSDATE` is read when evaluated, in the session's time zone, as `NOW` is). A hand-on
/// judges its leases after it waited for the queue's row, which may have been longer than
/// its margin.
const CLOCK: &str =
    "(UTC_TIMESTAMP(6) + INTERVAL TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6)) MICROSECOND)";

struct Tx<'a> {
    driver: &'a MySqlDriver,
    conn: &'a mut MySqlConnection,
    q: String,
    columns: &'static str,
}

fn ctx(driver: &MySqlDriver) -> String {
    driver.ctx("claiming under the queue's limits")
}

/// The queue's rows: a seek in the queue poll index (`PollQueue`, the queue of pending
/// rows outside 'default') unless the queue is 'default', and byte for byte.
fn queue_filter(queue: &str) -> String {
    let column = if queue.trim_end_matches(' ') == crate::command::DEFAULT_QUEUE {
        "`Queue`"
    } else {
        "`PollQueue`"
    };
    format!("{column} = ? AND {} = {}", exact("`Queue`"), exact_marks(1))
}

impl Tx<'_> {
    /// The candidates of `which`, locked, with the columns `select`.
    async fn locked_due(
        &mut self,
        select: &str,
        which: &Candidates<'_>,
    ) -> Result<Vec<sqlx::mysql::MySqlRow>> {
        let types = which.claim.types.as_deref().unwrap_or(&[]);
        let mut filter = String::new();
        if !types.is_empty() {
            filter.push_str(&format!(
                " AND `Type` IN ({}) AND {} IN ({})",
                marks(types.len()),
                exact("`Type`"),
                exact_marks(types.len())
            ));
        }
        if !which.except_keys.is_empty() {
            filter.push_str(&format!(
                " AND (`ConcurrencyKey` IS NULL OR {} NOT IN ({}))",
                exact("`ConcurrencyKey`"),
                exact_marks(which.except_keys.len())
            ));
        }
        if !which.except_ids.is_empty() {
            filter.push_str(&format!(
                " AND `Id` NOT IN ({})",
                marks(which.except_ids.len())
            ));
        }
        let sql = format!(
            "SELECT {select} FROM {} \
             WHERE {} AND {PENDING} AND `RunAt` <= {NOW} \
               AND (`LockedUntil` IS NULL OR `LockedUntil` <= {NOW}) \
               AND (`CreatedAt` <= {NOW} - INTERVAL ? MICROSECOND OR `CreatedAt` IS NULL){filter}{} \
             ORDER BY `Priority`, `RunAt`, `Id` LIMIT ? FOR UPDATE SKIP LOCKED",
            self.driver.t,
            queue_filter(which.queue),
            super::ordered_filter(&self.driver.t)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql))
            .bind(which.queue)
            .bind(which.queue)
            .bind(micros(which.claim.processing_delay));
        for type_name in types.iter().chain(types) {
            query = query.bind(type_name.clone());
        }
        for key in which.except_keys {
            query = query.bind(key.clone());
        }
        for id in which.except_ids {
            query = query.bind(id.clone());
        }
        query
            .bind(i64::from(which.limit))
            .fetch_all(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))
    }
}

#[async_trait::async_trait]
impl LimitedTx for Tx<'_> {
    async fn read_queue(&mut self, queue: &str) -> Result<Option<QueueRow>> {
        let sql = format!(
            "SELECT `Paused`, `RateTokens`, \
                    TIMESTAMPDIFF(MICROSECOND, `RateCheckedAt`, {NOW}) / 1e6 AS `Elapsed` \
             FROM {} WHERE `Queue` = ? FOR UPDATE",
            self.q
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(queue)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        Ok(row.map(|row| QueueRow {
            paused: paused_of(&row),
            tokens: row.try_get("RateTokens").ok().flatten(),
            elapsed: row.try_get("Elapsed").ok().flatten(),
        }))
    }

    async fn insert_queue(&mut self, queue: &str) -> Result<()> {
        let sql = format!(
            "INSERT INTO {} (`Queue`) VALUES (?) ON DUPLICATE KEY UPDATE `Queue` = `Queue`",
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
        let sql = format!(
            "SELECT COUNT(*) FROM {} WHERE {} AND {PENDING} AND `LockedUntil` > {NOW}",
            self.driver.t,
            queue_filter(queue)
        );
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(queue)
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
        let rows = self.locked_due("`Id`, `ConcurrencyKey`", which).await?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let id: String = row.try_get("Id").ok()?;
                let key: Option<String> = row.try_get("ConcurrencyKey").ok().flatten();
                Some((id, key))
            })
            .collect())
    }

    /// Reads the candidates whole and leases them: the read locked them, so the rows come
    /// back as read with the lease's columns set as the update sets them (no third
    /// statement reads them again).
    async fn claim_free(&mut self, which: &Candidates<'_>) -> Result<Vec<ClaimedRow>> {
        let select = format!("{}, {NOW} AS `IcqNow`", self.columns);
        let rows = self.locked_due(&select, which).await?;
        let ids: Vec<String> = rows
            .iter()
            .filter_map(|row| row.try_get::<String, _>("Id").ok())
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let claim = which.claim;
        let update = format!(
            "UPDATE {} SET `LockToken` = ?, `LockedUntil` = {NOW} + INTERVAL ? MICROSECOND, \
             `Attempts` = CASE WHEN `Attempts` BETWEEN 0 AND 2147483646 THEN `Attempts` + 1 \
             ELSE `Attempts` END WHERE `Id` IN ({})",
            self.driver.t,
            marks(ids.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(update))
            .bind(claim.token.to_string())
            .bind(micros(claim.lease));
        for id in &ids {
            query = query.bind(id);
        }
        query
            .execute(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        let lease = chrono::Duration::from_std(claim.lease).unwrap_or(chrono::Duration::MAX);
        let mut claimed = crate::engine::leased_rows(
            &self.driver.table,
            claim.token,
            rows.iter().map(|row| {
                let now = row
                    .try_get::<chrono::NaiveDateTime, _>("IcqNow")
                    .ok()
                    .map(|now| now.and_utc());
                let decoded = decode_row(row).map(|mut decoded| {
                    leased_as_updated(
                        &mut decoded,
                        claim.token,
                        now.and_then(|n| n.checked_add_signed(lease)),
                    );
                    decoded
                });
                (decoded, payload_bytes(row))
            }),
        );
        claimed.retain(|c| ids.iter().any(|id| id == c.lease.id.as_str()));
        Ok(claimed)
    }

    async fn running_by_key(
        &mut self,
        queue: &str,
        keys: &[String],
    ) -> Result<HashMap<String, u64>> {
        let sql = format!(
            "SELECT `ConcurrencyKey` AS k, COUNT(*) AS n FROM {} \
             WHERE `ConcurrencyKey` IN ({}) AND {PENDING} AND `LockedUntil` > {NOW} \
               AND {} = {} \
             GROUP BY `ConcurrencyKey`",
            self.driver.t,
            marks(keys.len()),
            exact("`Queue`"),
            exact_marks(1)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for key in keys {
            query = query.bind(key.clone());
        }
        let rows = query
            .bind(queue)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        // The column compares PAD SPACE (`a` = `a `): count by the exact key read back.
        let mut out = HashMap::new();
        for row in &rows {
            let (Ok(key), Ok(n)) = (row.try_get::<String, _>("k"), row.try_get::<i64, _>("n"))
            else {
                continue;
            };
            *out.entry(key).or_default() += n.max(0) as u64;
        }
        Ok(out)
    }

    async fn lease(&mut self, ids: &[&str], claim: &ClaimParams) -> Result<Vec<ClaimedRow>> {
        let list = marks(ids.len());
        let update = format!(
            "UPDATE {} SET `LockToken` = ?, `LockedUntil` = {NOW} + INTERVAL ? MICROSECOND, \
             `Attempts` = CASE WHEN `Attempts` BETWEEN 0 AND 2147483646 THEN `Attempts` + 1 \
             ELSE `Attempts` END WHERE `Id` IN ({list})",
            self.driver.t
        );
        let mut query = sqlx::query(AssertSqlSafe(update))
            .bind(claim.token.to_string())
            .bind(micros(claim.lease));
        for id in ids {
            query = query.bind(*id);
        }
        query
            .execute(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        let select = format!(
            "SELECT {} FROM {} WHERE `Id` IN ({list}) AND `LockToken` = ?",
            self.columns, self.driver.t
        );
        let mut query = sqlx::query(AssertSqlSafe(select));
        for id in ids {
            query = query.bind(*id);
        }
        let rows = query
            .bind(claim.token.to_string())
            .fetch_all(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        Ok(crate::engine::leased_rows(
            &self.driver.table,
            claim.token,
            rows.iter().map(|row| (decode_row(row), payload_bytes(row))),
        ))
    }

    async fn places_to_hand_on(
        &mut self,
        queue: &str,
        changes: &[SetState],
        margin: std::time::Duration,
    ) -> Result<Option<Places>> {
        let sql = format!(
            "SELECT c.`Id`, c.`LockToken`, c.`Queue`, \
                    (c.`ProcessedAt` IS NULL AND c.`DeadLetteredAt` IS NULL \
                     AND c.`LockedUntil` > {CLOCK} + INTERVAL ? MICROSECOND) AS `Live`, \
                    q.`Paused` \
             FROM {} AS q LEFT JOIN {} AS c ON c.`Id` IN ({}) \
             WHERE q.`Queue` = ? \
             LOCK IN SHARE MODE",
            self.q,
            self.driver.t,
            marks(changes.len()),
        );
        let mut query = sqlx::query(AssertSqlSafe(sql)).bind(micros(margin));
        for change in changes {
            query = query.bind(change.lease.id.as_str().to_owned());
        }
        let rows = query
            .bind(queue)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        let text = |row: &sqlx::mysql::MySqlRow, column: &str| {
            row.try_get::<Option<String>, _>(column).ok().flatten()
        };
        Ok(Some(Places::tally(
            queue,
            changes,
            rows.iter().map(|row| PlaceRow {
                paused: paused_of(row),
                id: text(row, "Id"),
                token: text(row, "LockToken"),
                queue: text(row, "Queue"),
                live: row.try_get::<Option<i64>, _>("Live").ok().flatten() == Some(1),
            }),
        )))
    }

    async fn store_tokens(&mut self, queue: &str, tokens: f64, advance: f64) -> Result<()> {
        let sql = format!(
            "UPDATE {} SET `RateTokens` = ?, \
                 `RateCheckedAt` = COALESCE(`RateCheckedAt` + INTERVAL ? MICROSECOND, {NOW}), \
                 `UpdatedAt` = {NOW} \
             WHERE `Queue` = ?",
            self.q
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(tokens)
            .bind((advance * 1e6).round() as i64)
            .bind(queue)
            .execute(&mut *self.conn)
            .await
            .map_err(Error::db(ctx(self.driver)))?;
        Ok(())
    }
}

impl MySqlDriver {
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
        let mut conn = self.pool.acquire().await.map_err(Error::db(ctx(self)))?;
        let q = self.table.queues().quoted(Engine::Mysql);
        {
            let mut look = Tx {
                driver: self,
                conn: &mut conn,
                q: q.clone(),
                columns,
            };
            if limits::full_before_claim(&mut look, params).await? {
                return Ok(LimitedClaim {
                    held: Some(limits::Held::Concurrency),
                    ..LimitedClaim::default()
                });
            }
        }
        // InnoDB picks a deadlock's victim among the stamps of this claim and those the
        // completers write beside it, and rolls its whole transaction back: try again at
        // once (a few times) rather than after the claim's retry pause.
        let mut tries = 0;
        loop {
            tries += 1;
            let mut tx = conn.begin().await.map_err(Error::db(ctx(self)))?;
            let claimed = {
                let mut steps = Tx {
                    driver: self,
                    conn: &mut tx,
                    q: q.clone(),
                    columns,
                };
                limits::claim_in(&mut steps, params).await
            };
            let claimed = match claimed {
                Ok(claimed) => claimed,
                Err(err) if tries < DEADLOCK_TRIES && deadlocked(&err) => continue,
                Err(err) => return Err(err),
            };
            tx.commit().await.map_err(Error::db(ctx(self)))?;
            return Ok(claimed);
        }
    }
}

#[cfg(all(test, feature = "driver-suite"))]
mod tests {
    //! The hand-on's read on a real MariaDB.

    use super::*;
    use crate::ConnectOptions;
    use crate::command::LeaseToken;
    use crate::engine::limits::testing::{
        assert_lapsed_place_kept, assert_one_place, hand_on_behind_a_count, places, seen,
        stalled_hand_on,
    };
    use crate::ident::TableName;

    /// A table of its own (`<tag>_<pid>`), created afresh: the server's URL, its name, a
    /// driver on it and its DDL (to drop it after).
    async fn fresh(tag: &str) -> (String, TableName, MySqlDriver, crate::schema::Ddl) {
        let url = std::env::var("ICQ_TEST_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
        let table = TableName::parse(&format!("{tag}_{}", std::process::id())).unwrap();
        let driver = MySqlDriver::connect(&url, &table, &ConnectOptions::default())
            .await
            .expect("MariaDB test server");
        let ddl = crate::schema::render(Engine::Mysql, &table);
        driver.table_drop(&ddl.down).await.unwrap();
        driver.schema_apply(&ddl.up).await.unwrap();
        (url, table, driver, ddl)
    }

    /// Only rows of the queue whose lease, under the change's token, outlives the margin
    /// give their places back (a queue that differs only in trailing spaces is another
    /// queue); the queue's pause is read beside them.
    #[tokio::test]
    async fn a_hand_on_counts_the_live_leases_it_ends() {
        let (_, table, driver, ddl) = fresh("icq_hand_on").await;
        let t = driver.t.clone();
        let token = LeaseToken::new();
        let mut conn = driver.pool.acquire().await.unwrap();
        // a: live for 20 s; b: for 5 s; c: another queue; d: `q ` (PAD SPACE equal).
        let mut ids = Vec::new();
        for (n, (queue, live)) in [("q", 20), ("q", 5), ("other", 20), ("q ", 20)]
            .into_iter()
            .enumerate()
        {
            let id = format!("hand-on-{n}");
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {t} (`Id`, `Type`, `Payload`, `Queue`, `LockToken`, `LockedUntil`) \
                 VALUES (?, 'work', '{{}}', ?, ?, {NOW} + INTERVAL ? SECOND)"
            )))
            .bind(&id)
            .bind(queue)
            .bind(token.to_string())
            .bind(live)
            .execute(&mut *conn)
            .await
            .unwrap();
            ids.push(id);
        }
        let q = table.queues().quoted(Engine::Mysql);
        let columns = driver.columns().await.unwrap();
        let mut tx = Tx {
            driver: &driver,
            conn: &mut conn,
            q: q.clone(),
            columns,
        };
        // A queue without its row of `<table>Queues` gives back no place.
        assert_eq!(
            places(&mut tx, "other", &ids[2..], token).await,
            seen(0, false)
        );
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {q} (`Queue`, `Paused`) VALUES ('q', 0)"
        )))
        .execute(&mut *tx.conn)
        .await
        .unwrap();
        assert_eq!(places(&mut tx, "q", &ids, token).await, seen(1, false));
        let stranger = LeaseToken::new();
        assert_eq!(
            places(&mut tx, "q", &ids[..1], stranger).await,
            seen(0, false)
        );
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {q} SET `Paused` = 1 WHERE `Queue` = 'q'"
        )))
        .execute(&mut *tx.conn)
        .await
        .unwrap();
        assert_eq!(places(&mut tx, "q", &ids[..1], token).await, seen(1, true));
        drop(conn);
        driver.table_drop(&ddl.down).await.unwrap();
    }

    /// Queue `q` of the table `t` (queues `q_table`) with its row and `<prefix>-r1`, leased
    /// under `held_by` for 1.3 s more (the margin of a 2 s lease is 1 s), then `due` rows
    /// due (`<prefix>-due-<n>`): R1's id.
    async fn leased_and_due(
        admin: &mut MySqlConnection,
        t: &str,
        q_table: &str,
        prefix: &str,
        held_by: LeaseToken,
        due: usize,
    ) -> String {
        let r1 = format!("{prefix}-r1");
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {t} (`Id`, `Type`, `Payload`, `Queue`, `LockToken`, `LockedUntil`, `RunAt`) \
             VALUES (?, 'work', '{{}}', 'q', ?, {NOW} + INTERVAL 1300000 MICROSECOND, \
                     {NOW} - INTERVAL 1 HOUR)"
        )))
        .bind(&r1)
        .bind(held_by.to_string())
        .execute(&mut *admin)
        .await
        .unwrap();
        for n in 0..due {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {t} (`Id`, `Type`, `Payload`, `Queue`) VALUES (?, 'work', '{{}}', 'q')"
            )))
            .bind(format!("{prefix}-due-{n}"))
            .execute(&mut *admin)
            .await
            .unwrap();
        }
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {q_table} (`Queue`) VALUES ('q')"
        )))
        .execute(&mut *admin)
        .await
        .unwrap();
        r1
    }

    /// The live leases of queue `q` in the table `t`.
    async fn live_in_q(admin: &mut MySqlConnection, t: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {t} WHERE `Queue` = 'q' AND `ProcessedAt` IS NULL \
               AND `DeadLetteredAt` IS NULL AND `LockedUntil` > {NOW}"
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
        use sqlx::Connection as _;

        let (url, table, driver, ddl) = fresh("icq_stalled").await;
        let driver = std::sync::Arc::new(driver);
        let (t, q) = (driver.t.clone(), table.queues().quoted(Engine::Mysql));
        let held_by = LeaseToken::new();
        let mut admin = sqlx::MySqlConnection::connect(&url).await.unwrap();
        let r1 = &leased_and_due(&mut admin, &t, &q, "stalled", held_by, 3).await;
        // Another session holds R1's row (an operator's tool, an abandoned statement).
        let mut blocker = sqlx::MySqlConnection::connect(&url).await.unwrap();
        let mut holding = blocker.begin().await.unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "SELECT 1 FROM {t} WHERE `Id` = ? LOCK IN SHARE MODE"
        )))
        .bind(r1)
        .fetch_all(&mut *holding)
        .await
        .unwrap();
        let release = async {
            holding.commit().await.unwrap();
        };
        let (handed, counted) = stalled_hand_on(driver.clone(), r1, held_by, release).await;
        let live = live_in_q(&mut admin, &t).await;
        driver.table_drop(&ddl.down).await.unwrap();
        assert_one_place(&handed, &counted, live);
    }

    /// A lease that lapses while its hand-on waits for the queue's row, held by a counting
    /// claim that fills the lapsed place, is not handed on: the hand-on judges its leases
    /// once it holds the row.
    #[tokio::test]
    async fn a_lease_that_lapses_behind_a_count_is_not_handed_on() {
        use sqlx::Connection as _;

        let (url, table, driver, ddl) = fresh("icq_lapsed").await;
        let driver = std::sync::Arc::new(driver);
        let (t, q) = (driver.t.clone(), table.queues().quoted(Engine::Mysql));
        let held_by = LeaseToken::new();
        let mut admin = sqlx::MySqlConnection::connect(&url).await.unwrap();
        let r1 = &leased_and_due(&mut admin, &t, &q, "lapsed", held_by, 2).await;
        // The counting claim: it holds the queue's row, fills R1's place once R1 has
        // lapsed, and commits.
        let mut counting = sqlx::MySqlConnection::connect(&url).await.unwrap();
        let mut holding = counting.begin().await.unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "SELECT 1 FROM {q} WHERE `Queue` = 'q' FOR UPDATE"
        )))
        .fetch_all(&mut *holding)
        .await
        .unwrap();
        let fill = async {
            tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE {t} SET `LockToken` = UUID(), `LockedUntil` = {NOW} + INTERVAL 60 SECOND \
                 WHERE `Id` = 'lapsed-due-0'"
            )))
            .execute(&mut *holding)
            .await
            .unwrap();
            holding.commit().await.unwrap();
        };
        let handed = hand_on_behind_a_count(driver.clone(), r1, held_by, fill).await;
        let live = live_in_q(&mut admin, &t).await;
        driver.table_drop(&ddl.down).await.unwrap();
        assert_lapsed_place_kept(&handed, live);
    }
}
