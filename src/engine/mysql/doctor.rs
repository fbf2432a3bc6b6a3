//! MariaDB/MySQL health reads: sizes from `information_schema.TABLES` (`DATA_LENGTH`,
//! `INDEX_LENGTH`, `DATA_FREE`, the estimated `TABLE_ROWS`), open transactions from
//! `information_schema.INNODB_TRX` joined with `PROCESSLIST`, InnoDB's history list
//! length (row versions kept for open read views: the analogue of PostgreSQL's dead
//! tuples) from `INNODB_METRICS`, and the oldest due command's wait.
//!
//! InnoDB's purge is server-wide, so every open transaction counts, whatever database it
//! reads. Seeing other users' transactions needs the `PROCESS` privilege; without it the
//! report says so instead of claiming there are none.

use async_trait::async_trait;
use sqlx::{AssertSqlSafe, Row};

use super::{MySqlDriver, NOW};
use crate::engine::Lifecycle;
use crate::engine::health::{
    HealthFacts, HealthOps, HealthReadParams, Session, SessionKind, TableStats, count, from_secs,
    query_head,
};
use crate::error::{Error, Result};

/// Sizes of the table `$2` in schema `$1` (the connection's database when NULL).
const TABLE_STATS: &str = "SELECT CAST(DATA_LENGTH AS SIGNED) AS data, \
     CAST(INDEX_LENGTH AS SIGNED) AS idx, CAST(DATA_FREE AS SIGNED) AS free, \
     CAST(TABLE_ROWS AS SIGNED) AS live_rows \
     FROM information_schema.TABLES \
     WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?";

/// Every open InnoDB transaction but the reader's own, oldest first.
const TRANSACTIONS: &str = "SELECT CAST(t.trx_mysql_thread_id AS SIGNED) AS pid, \
     CAST(t.trx_state AS CHAR) AS trx_state, CAST(p.COMMAND AS CHAR) AS command, \
     CAST(TIMESTAMPDIFF(SECOND, t.trx_started, NOW()) AS SIGNED) AS age, \
     CAST(p.TIME AS SIGNED) AS state_age, \
     CAST(LEFT(COALESCE(t.trx_query, p.INFO), 1000) AS CHAR) AS query, \
     CAST(p.USER AS CHAR) AS usr, CAST(p.HOST AS CHAR) AS host, CAST(p.DB AS CHAR) AS db \
     FROM information_schema.INNODB_TRX t \
     LEFT JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
     WHERE t.trx_mysql_thread_id <> CONNECTION_ID() \
     ORDER BY t.trx_started, t.trx_mysql_thread_id";

/// InnoDB's history list length, when its metric is enabled (`TIME_ENABLED` is set).
const HISTORY_LIST: &str = "SELECT CAST(`COUNT` AS SIGNED) FROM information_schema.INNODB_METRICS \
     WHERE NAME = 'trx_rseg_history_len' AND TIME_ENABLED IS NOT NULL";

impl MySqlDriver {
    async fn table_stats(&self, name: &str, shown: String) -> Result<Option<TableStats>> {
        let what = "reading the table's size (information_schema.TABLES)";
        let row = sqlx::query(TABLE_STATS)
            .bind(self.table.schema())
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(Error::db(self.ctx(what)))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let get = |c: &str| -> Result<Option<u64>> {
            Ok(count(
                row.try_get::<Option<i64>, _>(c)
                    .map_err(Error::db(self.ctx(what)))?,
            ))
        };
        let (data, idx) = (get("data")?.unwrap_or(0), get("idx")?.unwrap_or(0));
        Ok(Some(TableStats {
            table: shown,
            total_bytes: data + idx,
            table_bytes: data,
            index_bytes: idx,
            live_rows: get("live_rows")?,
            dead_rows: None,
            free_bytes: get("free")?,
            last_vacuum: None,
            last_autovacuum: None,
            storage_settings: None,
        }))
    }

    async fn transactions(&self) -> Result<Vec<Session>> {
        let what = "reading the open transactions (information_schema.INNODB_TRX)";
        let rows = sqlx::query(TRANSACTIONS)
            .fetch_all(&self.pool)
            .await
            .map_err(Error::db(self.ctx(what)))?;
        rows.iter()
            .map(|row| {
                let get_text = |c: &str| -> Result<Option<String>> {
                    row.try_get::<Option<String>, _>(c)
                        .map_err(Error::db(self.ctx(what)))
                };
                let get_int = |c: &str| -> Result<Option<i64>> {
                    row.try_get::<Option<i64>, _>(c)
                        .map_err(Error::db(self.ctx(what)))
                };
                let sleeping = get_text("command")?.as_deref() == Some("Sleep");
                let state = if sleeping {
                    Some("idle in transaction".to_owned())
                } else {
                    get_text("trx_state")?.map(|s| s.to_lowercase())
                };
                let age = get_int("age")?.map(|s| from_secs(s as f64));
                Ok(Session {
                    kind: SessionKind::Connection,
                    pid: get_int("pid")?,
                    name: None,
                    state,
                    transaction_age: age,
                    state_age: get_int("state_age")?.map(|s| from_secs(s as f64)),
                    xmin_age_transactions: None,
                    query_head: get_text("query")?
                        .filter(|q| !q.trim().is_empty())
                        .map(|q| query_head(&q)),
                    application_name: None,
                    client: get_text("host")?,
                    user: get_text("usr")?,
                    database: get_text("db")?,
                })
            })
            .collect()
    }

    /// The oldest due command's wait. On a version-2 table: the first unleased due row
    /// of each priority present, found by seeks into the poll index (`ProcessedAt`,
    /// `DeadLetteredAt`, `Priority`, `RunAt`) one priority after the other, never a pass
    /// over the backlog (a `MIN` over the due rows reads every one of them: see
    /// docs/doctor.md).
    async fn oldest_due_wait(&self) -> Result<Option<std::time::Duration>> {
        let t = &self.t;
        let what = "reading the oldest due command's wait";
        let due = format!(
            "`ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL AND `RunAt` <= {NOW} \
             AND (`LockedUntil` IS NULL OR `LockedUntil` <= {NOW})"
        );
        if self.schema_version().await? < 2 {
            let sql = format!(
                "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, MIN(`RunAt`), {NOW}) AS SIGNED) \
                 FROM {t} WHERE {due}"
            );
            let micros: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql))
                .fetch_one(&self.pool)
                .await
                .map_err(Error::db(self.ctx(what)))?;
            return Ok(micros.map(|m| from_secs(m as f64 / 1e6)));
        }
        let next_priority = format!(
            "SELECT `Priority` FROM {t} WHERE `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL \
             AND `Priority` > ? ORDER BY `Priority` LIMIT 1"
        );
        let head = format!(
            "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, `RunAt`, {NOW}) AS SIGNED) FROM {t} \
             WHERE {due} AND `Priority` = ? ORDER BY `RunAt` LIMIT 1"
        );
        let mut oldest: Option<i64> = None;
        let mut after = i32::from(i16::MIN) - 1;
        // At most one round per priority value present (`SMALLINT`): each round is two seeks.
        for _ in 0..=u16::MAX {
            let Some(priority): Option<i16> =
                sqlx::query_scalar(AssertSqlSafe(next_priority.clone()))
                    .bind(after)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(Error::db(self.ctx(what)))?
            else {
                break;
            };
            let wait: Option<i64> = sqlx::query_scalar(AssertSqlSafe(head.clone()))
                .bind(priority)
                .fetch_optional(&self.pool)
                .await
                .map_err(Error::db(self.ctx(what)))?;
            if let Some(wait) = wait {
                oldest = Some(oldest.map_or(wait, |o| o.max(wait)));
            }
            after = i32::from(priority);
        }
        Ok(oldest.map(|m| from_secs(m as f64 / 1e6)))
    }
}

#[async_trait]
impl HealthOps for MySqlDriver {
    async fn health_read(&self, params: &HealthReadParams) -> Result<HealthFacts> {
        let mut facts = HealthFacts {
            table: self
                .table_stats(self.table.name(), self.table.to_string())
                .await?,
            ..HealthFacts::default()
        };
        if params.history {
            let name = format!("{}History", self.table.name());
            let shown = format!("{}History", self.table);
            facts.history = self.table_stats(&name, shown).await?;
        }
        match self.transactions().await {
            Ok(transactions) => {
                facts.xmin_holder = transactions.first().cloned();
                facts.long_transactions = transactions
                    .into_iter()
                    .filter(|s| s.transaction_age >= Some(params.long_after))
                    .collect();
            }
            Err(err) => facts.notes.push(format!(
                "open transactions could not be read ({err}): grant the PROCESS privilege to see them"
            )),
        }
        match sqlx::query_scalar::<_, Option<i64>>(HISTORY_LIST)
            .fetch_optional(&self.pool)
            .await
        {
            Ok(Some(length)) => facts.history_list_length = count(length),
            Ok(None) => facts.notes.push(
                "InnoDB's history list length is unavailable: its metric is off \
                 (SET GLOBAL innodb_monitor_enable = 'trx_rseg_history_len')"
                    .to_owned(),
            ),
            Err(err) => facts.notes.push(format!(
                "InnoDB's history list length could not be read ({err}): grant the PROCESS privilege"
            )),
        }
        if facts.table.is_some() {
            facts.oldest_due_wait = self.oldest_due_wait().await?;
        }
        Ok(facts)
    }
}
