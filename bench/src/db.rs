//! Fresh databases per run on the local servers, and the small SQL helpers every peer
//! shares (bulk COPY, ANALYZE + CHECKPOINT before the clock starts).

use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result};
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool, postgres::PgPoolOptions};

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// `icq_bench_<pid>_<n>`: unique within this process, recognisable afterwards.
pub fn fresh_name() -> String {
    format!(
        "icq_bench_{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A database created for one peer's run and dropped afterwards.
pub struct FreshDb {
    pub server: String,
    pub name: String,
    pub kind: Server,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    Postgres,
    MySql,
}

impl FreshDb {
    pub async fn postgres(server: &str) -> Result<Self> {
        let name = fresh_name();
        let mut admin = PgConnection::connect(&format!("{server}/postgres"))
            .await
            .with_context(|| format!("connecting to PostgreSQL at {server}"))?;
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut admin)
            .await
            .with_context(|| format!("creating database {name}"))?;
        Ok(Self {
            server: server.to_owned(),
            name,
            kind: Server::Postgres,
        })
    }

    pub async fn mysql(server: &str) -> Result<Self> {
        let name = fresh_name();
        let mut admin = sqlx::MySqlConnection::connect(server)
            .await
            .with_context(|| format!("connecting to MariaDB/MySQL at {server}"))?;
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .execute(&mut admin)
            .await
            .with_context(|| format!("creating database {name}"))?;
        Ok(Self {
            server: server.to_owned(),
            name,
            kind: Server::MySql,
        })
    }

    pub fn url(&self) -> String {
        format!("{}/{}", self.server, self.name)
    }

    pub async fn pg_pool(&self, max: u32) -> Result<PgPool> {
        PgPoolOptions::new()
            .max_connections(max)
            .connect(&self.url())
            .await
            .with_context(|| format!("connecting to {}", self.name))
    }

    /// Drops the database (forcing off any connection a peer left behind).
    pub async fn drop_db(self, keep: bool) -> Result<()> {
        if keep {
            eprintln!("  (kept database {})", self.name);
            return Ok(());
        }
        match self.kind {
            Server::Postgres => {
                let mut admin = PgConnection::connect(&format!("{}/postgres", self.server)).await?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                    self.name
                )))
                .execute(&mut admin)
                .await
                .with_context(|| format!("dropping database {}", self.name))?;
            }
            Server::MySql => {
                let mut admin = sqlx::MySqlConnection::connect(&self.server).await?;
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS `{}`",
                    self.name
                )))
                .execute(&mut admin)
                .await
                .with_context(|| format!("dropping database {}", self.name))?;
            }
        }
        Ok(())
    }
}

/// Streams `jobs` rows into `statement` (a `COPY … FROM STDIN` in text format), each row
/// being `row` (already tab-separated, without the newline).
pub async fn copy_rows(
    conn: &mut PgConnection,
    statement: &str,
    row: &str,
    jobs: usize,
) -> Result<()> {
    let mut copy = conn
        .copy_in_raw(statement)
        .await
        .with_context(|| statement.to_owned())?;
    let line = format!("{row}\n");
    let chunk_rows = 5_000;
    let chunk = line.repeat(chunk_rows);
    let mut left = jobs;
    while left > 0 {
        let n = left.min(chunk_rows);
        copy.send(&chunk.as_bytes()[..n * line.len()]).await?;
        left -= n;
    }
    let copied = copy.finish().await?;
    anyhow::ensure!(
        copied as usize == jobs,
        "COPY wrote {copied} rows, expected {jobs}"
    );
    Ok(())
}

/// What every PostgreSQL peer gets after its backlog is loaded and before the clock
/// starts: fresh planner statistics for its tables and a checkpoint, so that no peer pays
/// for an autovacuum/analyze or a checkpoint of the load inside its timed drain.
pub async fn settle_postgres(pool: &PgPool, tables: &[&str]) -> Result<()> {
    for table in tables {
        sqlx::raw_sql(AssertSqlSafe(format!("ANALYZE {table}")))
            .execute(pool)
            .await
            .with_context(|| format!("ANALYZE {table}"))?;
    }
    sqlx::raw_sql("CHECKPOINT")
        .execute(pool)
        .await
        .context("CHECKPOINT")?;
    Ok(())
}
