//! Every statement the sustained mode runs against the database under test, per engine:
//! the producer's plain multi-row INSERTs, the sampler's size and backlog queries, the
//! fault that holds back cleanup, and the rescue watch's lookups.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{AssertSqlSafe, Connection};

use crate::icq::Engine;

/// The type every command of the run has.
pub const TYPE: &str = "bench.sustained";
const TABLE: &str = "InternalCommands";
const HISTORY: &str = "InternalCommandsHistory";

/// One connection pool on the database under test.
#[derive(Clone)]
pub enum Db {
    Postgres(PgPool),
    Mysql(MySqlPool),
    Sqlite { pool: SqlitePool, file: PathBuf },
}

/// One sample of the table's footprint.
#[derive(Clone, Copy, Debug, Default)]
pub struct Footprint {
    /// Pending rows (neither completed nor dead) in the hot table.
    pub backlog: i64,
    /// The commands table with its indexes, in bytes (see README for each engine's measure).
    pub table_bytes: i64,
    /// PostgreSQL: `n_dead_tup`; MariaDB: InnoDB's history list length (server-wide).
    pub dead: Option<i64>,
    /// `<table>History` with its indexes, when that table exists.
    pub history_bytes: Option<i64>,
}

/// What the table holds at the end of the run.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Final {
    pub rows: i64,
    pub completed: i64,
    pub pending: i64,
    pub dead_lettered: i64,
    pub history_rows: Option<i64>,
}

impl Db {
    pub async fn connect(engine: Engine, url: &str, file: Option<PathBuf>) -> Result<Self> {
        Ok(match engine {
            Engine::Postgres => Self::Postgres(
                PgPoolOptions::new()
                    .max_connections(4)
                    .connect(url)
                    .await
                    .with_context(|| format!("connecting to {url}"))?,
            ),
            Engine::Mysql => Self::Mysql(
                MySqlPoolOptions::new()
                    .max_connections(4)
                    .connect(url)
                    .await
                    .with_context(|| format!("connecting to {url}"))?,
            ),
            Engine::Sqlite => {
                let options = url
                    .parse::<SqliteConnectOptions>()?
                    .journal_mode(SqliteJournalMode::Wal)
                    .busy_timeout(Duration::from_secs(30));
                Self::Sqlite {
                    pool: SqlitePoolOptions::new()
                        .max_connections(4)
                        .connect_with(options)
                        .await
                        .with_context(|| format!("connecting to {url}"))?,
                    file: file.context("a SQLite run needs its file")?,
                }
            }
        })
    }

    pub async fn close(&self) {
        match self {
            Self::Postgres(p) => p.close().await,
            Self::Mysql(p) => p.close().await,
            Self::Sqlite { pool, .. } => pool.close().await,
        }
    }

    /// One plain multi-row INSERT of commands `first .. first + count` (payload `{"n": …}`),
    /// naming only `Type` and `Payload`, as another program would.
    pub async fn insert(&self, first: u64, count: u64) -> Result<()> {
        let values: Vec<String> = (first..first + count)
            .map(|n| format!("('{TYPE}', '{{\"n\":{n}}}')"))
            .collect();
        let head = match self {
            Self::Mysql(_) => format!("INSERT INTO `{TABLE}` (`Type`, `Payload`) VALUES "),
            _ => format!("INSERT INTO \"{TABLE}\" (\"Type\", \"Payload\") VALUES "),
        };
        let sql = AssertSqlSafe(format!("{head}{}", values.join(", ")));
        match self {
            Self::Postgres(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
            Self::Mysql(p) => sqlx::raw_sql(sql).execute(p).await.map(drop),
            Self::Sqlite { pool, .. } => sqlx::raw_sql(sql).execute(pool).await.map(drop),
        }
        .context("the producer's INSERT")
    }

    pub async fn footprint(&self) -> Result<Footprint> {
        Ok(match self {
            Self::Postgres(p) => {
                let backlog: i64 = sqlx::query_scalar(
                    r#"SELECT count(*) FROM "InternalCommands"
                       WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#,
                )
                .fetch_one(p)
                .await?;
                let (table_bytes, dead): (i64, Option<i64>) = sqlx::query_as(
                    r#"SELECT pg_total_relation_size('"InternalCommands"'),
                              (SELECT n_dead_tup FROM pg_stat_user_tables
                               WHERE relid = '"InternalCommands"'::regclass)"#,
                )
                .fetch_one(p)
                .await?;
                let history_bytes: Option<i64> = sqlx::query_scalar(
                    r#"SELECT pg_total_relation_size(to_regclass('"InternalCommandsHistory"'))"#,
                )
                .fetch_one(p)
                .await?;
                Footprint {
                    backlog,
                    table_bytes,
                    dead,
                    history_bytes,
                }
            }
            Self::Mysql(p) => {
                let backlog: i64 = sqlx::query_scalar(
                    "SELECT CAST(count(*) AS SIGNED) FROM `InternalCommands` \
                     WHERE `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL",
                )
                .fetch_one(p)
                .await?;
                let size = |name: &str| {
                    format!(
                        "SELECT CAST(data_length + index_length + data_free AS SIGNED) \
                         FROM information_schema.tables \
                         WHERE table_schema = DATABASE() AND table_name = '{name}'"
                    )
                };
                let table_bytes: i64 = sqlx::query_scalar(AssertSqlSafe(size(TABLE)))
                    .fetch_one(p)
                    .await?;
                let history_bytes: Option<i64> = sqlx::query_scalar(AssertSqlSafe(size(HISTORY)))
                    .fetch_optional(p)
                    .await?;
                // The purge lag: undo records not yet purged because a read view may need
                // them, InnoDB's counterpart of dead tuples (server-wide).
                let dead: Option<i64> = sqlx::query_scalar(
                    "SELECT CAST(`count` AS SIGNED) FROM information_schema.innodb_metrics \
                     WHERE name = 'trx_rseg_history_len'",
                )
                .fetch_optional(p)
                .await
                .ok()
                .flatten();
                Footprint {
                    backlog,
                    table_bytes,
                    dead,
                    history_bytes,
                }
            }
            Self::Sqlite { pool, file } => {
                let backlog: i64 = sqlx::query_scalar(
                    r#"SELECT count(*) FROM "InternalCommands"
                       WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#,
                )
                .fetch_one(pool)
                .await?;
                let len = |p: PathBuf| std::fs::metadata(p).map(|m| m.len() as i64).unwrap_or(0);
                let mut wal = file.clone().into_os_string();
                wal.push("-wal");
                let table_bytes = len(file.clone()) + len(PathBuf::from(wal));
                let has_history: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
                )
                .bind(HISTORY)
                .fetch_one(pool)
                .await?;
                // The history shares the file: its pages counted through dbstat when the
                // SQLite build has it.
                let history_bytes = if has_history > 0 {
                    sqlx::query_scalar::<_, i64>(
                        "SELECT COALESCE(sum(pgsize), 0) FROM dbstat WHERE name IN \
                         (SELECT name FROM sqlite_master WHERE tbl_name = ?)",
                    )
                    .bind(HISTORY)
                    .fetch_one(pool)
                    .await
                    .ok()
                } else {
                    None
                };
                Footprint {
                    backlog,
                    table_bytes,
                    dead: None,
                    history_bytes,
                }
            }
        })
    }

    /// The rows leased right now (`LockedUntil` in the future, not finished), with the `n`
    /// of their payloads.
    pub async fn leased(&self) -> Result<Vec<(String, u64)>> {
        let rows: Vec<(String, String)> = match self {
            Self::Postgres(p) => {
                sqlx::query_as(
                    r#"SELECT "Id"::text, "Payload"::text FROM "InternalCommands"
                       WHERE "LockedUntil" > now()
                         AND "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#,
                )
                .fetch_all(p)
                .await?
            }
            Self::Mysql(p) => {
                sqlx::query_as(
                    "SELECT `Id`, CAST(`Payload` AS CHAR) FROM `InternalCommands` \
                     WHERE `LockedUntil` > UTC_TIMESTAMP(6) \
                       AND `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL",
                )
                .fetch_all(p)
                .await?
            }
            Self::Sqlite { pool, .. } => {
                sqlx::query_as(
                    r#"SELECT "Id", "Payload" FROM "InternalCommands"
                       WHERE "LockedUntil" > strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
                         AND "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#,
                )
                .fetch_all(pool)
                .await?
            }
        };
        Ok(rows
            .into_iter()
            .filter_map(|(id, payload)| {
                let n = serde_json::from_str::<serde_json::Value>(&payload)
                    .ok()?
                    .get("n")?
                    .as_u64()?;
                Some((id, n))
            })
            .collect())
    }

    /// How many of `ids` are still pending (neither completed nor dead; a row moved to the
    /// history table is done).
    pub async fn still_pending(&self, ids: &[String]) -> Result<i64> {
        if ids.is_empty() {
            return Ok(0);
        }
        // The ids came from the table itself; anything but a uuid's characters is refused
        // rather than spliced.
        anyhow::ensure!(
            ids.iter()
                .all(|id| id.chars().all(|c| c.is_ascii_hexdigit() || c == '-')),
            "an id that is not a uuid"
        );
        let list = ids
            .iter()
            .map(|id| format!("'{id}'"))
            .collect::<Vec<_>>()
            .join(", ");
        Ok(match self {
            Self::Postgres(p) => {
                sqlx::query_scalar(AssertSqlSafe(format!(
                    r#"SELECT count(*) FROM "InternalCommands" WHERE "Id" IN ({list})
                       AND "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#
                )))
                .fetch_one(p)
                .await?
            }
            Self::Mysql(p) => sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT CAST(count(*) AS SIGNED) FROM `InternalCommands` WHERE `Id` IN ({list}) \
                     AND `ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL"
            )))
            .fetch_one(p)
            .await?,
            Self::Sqlite { pool, .. } => {
                sqlx::query_scalar(AssertSqlSafe(format!(
                    r#"SELECT count(*) FROM "InternalCommands" WHERE "Id" IN ({list})
                       AND "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL"#
                )))
                .fetch_one(pool)
                .await?
            }
        })
    }

    /// Holds back cleanup for `hold` from a separate connection, the way a forgotten
    /// transaction does: PostgreSQL, a transaction id taken and left idle in transaction
    /// (it holds the xmin horizon); MariaDB, a consistent snapshot with one read (it holds
    /// back purge); SQLite, a read transaction (it holds back WAL checkpoints).
    pub async fn hold_snapshot(&self, url: &str, hold: Duration) -> Result<()> {
        match self {
            Self::Postgres(_) => {
                let mut conn = sqlx::PgConnection::connect(url).await?;
                sqlx::raw_sql("BEGIN").execute(&mut conn).await?;
                let _: i64 = sqlx::query_scalar("SELECT txid_current()")
                    .fetch_one(&mut conn)
                    .await?;
                tokio::time::sleep(hold).await;
                sqlx::raw_sql("COMMIT").execute(&mut conn).await?;
                conn.close().await?;
            }
            Self::Mysql(_) => {
                let mut conn = sqlx::MySqlConnection::connect(url).await?;
                sqlx::raw_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                    .execute(&mut conn)
                    .await?;
                let _: i64 =
                    sqlx::query_scalar("SELECT CAST(count(*) AS SIGNED) FROM `InternalCommands`")
                        .fetch_one(&mut conn)
                        .await?;
                tokio::time::sleep(hold).await;
                sqlx::raw_sql("COMMIT").execute(&mut conn).await?;
                conn.close().await?;
            }
            Self::Sqlite { pool, .. } => {
                let mut conn = pool.acquire().await?;
                sqlx::raw_sql("BEGIN").execute(&mut *conn).await?;
                let _: i64 = sqlx::query_scalar(r#"SELECT count(*) FROM "InternalCommands""#)
                    .fetch_one(&mut *conn)
                    .await?;
                tokio::time::sleep(hold).await;
                sqlx::raw_sql("COMMIT").execute(&mut *conn).await?;
            }
        }
        Ok(())
    }

    /// Row counts at the end: the hot table by state, plus `<table>History` if it exists.
    pub async fn final_counts(&self) -> Result<Final> {
        let (rows, completed, pending, dead_lettered): (i64, i64, i64, i64) = match self {
            Self::Postgres(p) => {
                sqlx::query_as(
                    r#"SELECT count(*), count("ProcessedAt"),
                              count(*) FILTER (WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL),
                              count("DeadLetteredAt")
                       FROM "InternalCommands""#,
                )
                .fetch_one(p)
                .await?
            }
            Self::Mysql(p) => {
                sqlx::query_as(
                    "SELECT CAST(count(*) AS SIGNED), CAST(count(`ProcessedAt`) AS SIGNED), \
                            CAST(COALESCE(SUM(`ProcessedAt` IS NULL AND `DeadLetteredAt` IS NULL), 0) AS SIGNED), \
                            CAST(count(`DeadLetteredAt`) AS SIGNED) \
                     FROM `InternalCommands`",
                )
                .fetch_one(p)
                .await?
            }
            Self::Sqlite { pool, .. } => {
                sqlx::query_as(
                    r#"SELECT count(*), count("ProcessedAt"),
                              count(*) FILTER (WHERE "ProcessedAt" IS NULL AND "DeadLetteredAt" IS NULL),
                              count("DeadLetteredAt")
                       FROM "InternalCommands""#,
                )
                .fetch_one(pool)
                .await?
            }
        };
        let history_rows = match self {
            Self::Postgres(p) => {
                let mut conn = p.acquire().await?;
                crate::icq::history_rows_pg(&mut conn).await?
            }
            Self::Mysql(p) => {
                let mut conn = p.acquire().await?;
                crate::icq::history_rows_mysql(&mut conn).await?
            }
            Self::Sqlite { pool, .. } => {
                let mut conn = pool.acquire().await?;
                crate::icq::history_rows_sqlite(&mut conn).await?
            }
        };
        Ok(Final {
            rows,
            completed,
            pending,
            dead_lettered,
            history_rows,
        })
    }
}
