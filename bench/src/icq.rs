//! icq, run the way a user runs it: the DDL from `icq migrate add --stdout`, a backlog
//! loaded with plain SQL, then `icq work --until-idle --config icq.yaml` at icq's default
//! settings, timed as a process. Afterwards SQL checks that every row has `ProcessedAt`,
//! counting the rows of `<table>History` (where a schema that moves completed commands
//! out of the hot table keeps them) as completed when that table exists.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sqlx::{AssertSqlSafe, Connection, MySqlConnection, SqliteConnection};

use crate::db::{self, FreshDb};
use crate::{Drain, Opts};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Postgres,
    Sqlite,
    Mysql,
}

impl Engine {
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s.trim() {
            "postgres" | "postgresql" | "pg" => Self::Postgres,
            "sqlite" => Self::Sqlite,
            "mysql" | "mariadb" => Self::Mysql,
            other => bail!("unknown engine `{other}` (expected postgres, sqlite or mysql)"),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Sqlite => "sqlite",
            Self::Mysql => "mysql",
        }
    }
}

/// One icq build under test: the current one, or the `--icq-baseline-bin` one.
#[derive(Clone, Debug)]
pub struct IcqBin {
    pub label: &'static str,
    pub path: PathBuf,
    pub version: String,
}

impl IcqBin {
    pub async fn probe(label: &'static str, path: &Path) -> Result<Self> {
        let path = path.canonicalize().with_context(|| {
            format!(
                "{label}: no icq binary at {} (build it with `cargo build --release --bin icq` \
                 at the repository root, or pass the path)",
                path.display()
            )
        })?;
        let out = tokio::process::Command::new(&path)
            .arg("--version")
            .output()
            .await
            .with_context(|| format!("running {} --version", path.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "{} --version failed: {}",
            path.display(),
            out.status
        );
        let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        Ok(Self {
            label,
            path,
            version,
        })
    }
}

const TABLE: &str = "\"InternalCommands\"";

/// Drains the backlog with `replicas` concurrent `icq work --until-idle` processes on one
/// table (1 for the usual row), timed from the first spawn to the last exit.
pub async fn run(bin: &IcqBin, engine: Engine, opts: &Opts, replicas: usize) -> Result<Drain> {
    let tmp = tempfile::Builder::new().prefix("icq-bench-").tempdir()?;
    let ddl = table_ddl(bin, engine, opts, tmp.path()).await?;
    match engine {
        Engine::Postgres => {
            let db = FreshDb::postgres(&opts.pg_server).await?;
            let result = async {
                let pool = db.pg_pool(2).await?;
                sqlx::raw_sql(AssertSqlSafe(ddl))
                    .execute(&pool)
                    .await
                    .context("applying icq's DDL")?;
                {
                    let mut conn = pool.acquire().await?;
                    db::copy_rows(
                        &mut conn,
                        r#"COPY "InternalCommands" ("Type", "Payload") FROM STDIN"#,
                        "bench.noop\t{}",
                        opts.jobs,
                    )
                    .await?;
                }
                db::settle_postgres(&pool, &[TABLE]).await?;
                pool.close().await;
                let seconds = work(bin, &db.url(), tmp.path(), opts, replicas).await?;
                let mut conn = sqlx::PgConnection::connect(&db.url()).await?;
                let (done, left, twice): (i64, i64, i64) = sqlx::query_as(
                    r#"SELECT count(*) FILTER (WHERE "ProcessedAt" IS NOT NULL),
                              count(*) FILTER (WHERE "ProcessedAt" IS NULL),
                              count(*) FILTER (WHERE "Attempts" > 1)
                       FROM "InternalCommands""#,
                )
                .fetch_one(&mut conn)
                .await?;
                let moved = history_rows_pg(&mut conn).await?.unwrap_or(0);
                conn.close().await?;
                verified(seconds, done + moved, left, twice, opts.jobs)
            }
            .await;
            db.drop_db(opts.keep_databases).await?;
            result
        }
        Engine::Sqlite => {
            let file = tmp.path().join("bench.db");
            let url = format!("sqlite://{}?mode=rwc", file.display());
            let mut conn = SqliteConnection::connect(&url)
                .await
                .with_context(|| url.clone())?;
            sqlx::raw_sql(AssertSqlSafe(ddl))
                .execute(&mut conn)
                .await
                .context("applying icq's DDL")?;
            insert_values(
                &mut conn,
                r#"INSERT INTO "InternalCommands" ("Type", "Payload") VALUES "#,
                opts.jobs,
                500,
            )
            .await?;
            conn.close().await?;
            let seconds = work(bin, &url, tmp.path(), opts, replicas).await?;
            let mut conn = SqliteConnection::connect(&url).await?;
            let (done, left, twice): (i64, i64, i64) = sqlx::query_as(
                r#"SELECT count("ProcessedAt"), count(*) - count("ProcessedAt"),
                          count(*) FILTER (WHERE "Attempts" > 1) FROM "InternalCommands""#,
            )
            .fetch_one(&mut conn)
            .await?;
            let moved = history_rows_sqlite(&mut conn).await?.unwrap_or(0);
            conn.close().await?;
            if opts.keep_databases {
                let kept = tmp.keep();
                eprintln!("  (kept {})", kept.display());
            }
            verified(seconds, done + moved, left, twice, opts.jobs)
        }
        Engine::Mysql => {
            let db = FreshDb::mysql(&opts.mysql_server).await?;
            let result = async {
                let mut conn = MySqlConnection::connect(&db.url()).await?;
                sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut conn).await.context("applying icq's DDL")?;
                insert_values(&mut conn, "INSERT INTO `InternalCommands` (`Type`, `Payload`) VALUES ", opts.jobs, 2_000)
                    .await?;
                sqlx::raw_sql("ANALYZE TABLE `InternalCommands`").execute(&mut conn).await?;
                conn.close().await?;
                let seconds = work(bin, &db.url(), tmp.path(), opts, replicas).await?;
                let mut conn = MySqlConnection::connect(&db.url()).await?;
                let (done, left, twice): (i64, i64, i64) = sqlx::query_as(
                    "SELECT CAST(count(`ProcessedAt`) AS SIGNED), \
                            CAST(count(*) - count(`ProcessedAt`) AS SIGNED), \
                            CAST(COALESCE(SUM(`Attempts` > 1), 0) AS SIGNED) FROM `InternalCommands`",
                )
                .fetch_one(&mut conn)
                .await?;
                let moved = history_rows_mysql(&mut conn).await?.unwrap_or(0);
                conn.close().await?;
                verified(seconds, done + moved, left, twice, opts.jobs)
            }
            .await;
            db.drop_db(opts.keep_databases).await?;
            result
        }
    }
}

/// Rows in `"InternalCommandsHistory"`, or `None` when the schema has no history table.
/// Completed commands moved there count as done.
pub async fn history_rows_pg(conn: &mut sqlx::PgConnection) -> Result<Option<i64>> {
    let exists: bool =
        sqlx::query_scalar(r#"SELECT to_regclass('"InternalCommandsHistory"') IS NOT NULL"#)
            .fetch_one(&mut *conn)
            .await?;
    if !exists {
        return Ok(None);
    }
    let rows: i64 = sqlx::query_scalar(r#"SELECT count(*) FROM "InternalCommandsHistory""#)
        .fetch_one(&mut *conn)
        .await?;
    Ok(Some(rows))
}

/// The same on MariaDB/MySQL.
pub async fn history_rows_mysql(conn: &mut MySqlConnection) -> Result<Option<i64>> {
    let exists: i64 = sqlx::query_scalar(
        "SELECT CAST(count(*) AS SIGNED) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = 'InternalCommandsHistory'",
    )
    .fetch_one(&mut *conn)
    .await?;
    if exists == 0 {
        return Ok(None);
    }
    let rows: i64 =
        sqlx::query_scalar("SELECT CAST(count(*) AS SIGNED) FROM `InternalCommandsHistory`")
            .fetch_one(&mut *conn)
            .await?;
    Ok(Some(rows))
}

/// The same on SQLite.
pub async fn history_rows_sqlite(conn: &mut SqliteConnection) -> Result<Option<i64>> {
    let exists: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'InternalCommandsHistory'",
    )
    .fetch_one(&mut *conn)
    .await?;
    if exists == 0 {
        return Ok(None);
    }
    let rows: i64 = sqlx::query_scalar(r#"SELECT count(*) FROM "InternalCommandsHistory""#)
        .fetch_one(&mut *conn)
        .await?;
    Ok(Some(rows))
}

/// `twice`: rows whose `Attempts` is above 1, i.e. claimed more than once. With no crash
/// and no failure that is the upper bound of double executions (a row released unstarted
/// gives its attempt back).
fn verified(seconds: f64, done: i64, left: i64, twice: i64, jobs: usize) -> Result<Drain> {
    anyhow::ensure!(
        (done + left) as usize == jobs,
        "the table holds {} rows after the drain, expected {jobs}",
        done + left
    );
    Ok(Drain {
        seconds,
        unfinished: left as u64,
        handled: None,
        claimed_twice: Some(twice as u64),
    })
}

/// The DDL `bin`'s drain runs on: `icq migrate add` of its `--icq-ddl-from` (or of `bin`)
/// or that `.sql` file, at the schema version asked for `bin`.
async fn table_ddl(bin: &IcqBin, engine: Engine, opts: &Opts, dir: &Path) -> Result<String> {
    let (from, version) = match bin.label {
        "icq" => (&opts.icq_ddl_from, opts.icq_schema_version),
        _ => (
            &opts.icq_baseline_ddl_from,
            opts.icq_baseline_schema_version,
        ),
    };
    let from = from.as_deref().unwrap_or(&bin.path);
    let ddl = if from.extension().is_some_and(|e| e == "sql") {
        std::fs::read_to_string(from)
            .with_context(|| format!("reading the DDL in {}", from.display()))?
    } else {
        migration(from, engine, dir).await?
    };
    match version {
        Some(3) => without_version_4(&ddl),
        _ => Ok(ddl),
    }
}

/// The marker that opens the version-4 section of `icq migrate add`'s DDL; the section
/// ends at the next empty line.
const VERSION_4_SECTION: &str = "-- Schema version 4:";

/// `ddl` at schema version 3: its version-4 section left out.
fn without_version_4(ddl: &str) -> Result<String> {
    anyhow::ensure!(
        ddl.lines().any(|l| l.starts_with(VERSION_4_SECTION)),
        "--icq-schema-version 3: the DDL has no `{VERSION_4_SECTION}` section to leave out"
    );
    let mut inside = false;
    let mut kept = String::with_capacity(ddl.len());
    for line in ddl.lines() {
        if line.starts_with(VERSION_4_SECTION) {
            inside = true;
        } else if inside && line.trim().is_empty() {
            inside = false;
        }
        if !inside {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    Ok(kept)
}

/// `icq migrate add --engine <engine> --stdout`, run in a scratch directory.
pub async fn migration(bin: &Path, engine: Engine, dir: &Path) -> Result<String> {
    let out = tokio::process::Command::new(bin)
        .args(["migrate", "add", "--engine", engine.name(), "--stdout"])
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {} migrate add", bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} migrate add --engine {} --stdout failed ({}): {}",
            bin.display(),
            engine.name(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let sql = String::from_utf8(out.stdout).context("icq migrate add printed non-UTF-8")?;
    anyhow::ensure!(
        sql.contains("CREATE TABLE"),
        "icq migrate add --stdout printed no CREATE TABLE:\n{sql}"
    );
    Ok(sql)
}

/// Many `(…), (…)` rows per INSERT, all in one transaction.
async fn insert_values<C>(conn: &mut C, head: &str, jobs: usize, per_statement: usize) -> Result<()>
where
    C: Connection,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
{
    let row = "('bench.noop', '{}')";
    let mut tx = conn.begin().await?;
    let mut left = jobs;
    while left > 0 {
        let n = left.min(per_statement);
        let sql = format!("{head}{}", vec![row; n].join(", "));
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await
            .context("inserting the backlog")?;
        left -= n;
    }
    tx.commit().await?;
    Ok(())
}

/// Writes icq.yaml (default settings: no `settings:` block) and times `replicas`
/// concurrent `icq work --until-idle --config icq.yaml` processes, first spawn to last exit.
async fn work(bin: &IcqBin, url: &str, dir: &Path, opts: &Opts, replicas: usize) -> Result<f64> {
    let config = dir.join("icq.yaml");
    let handler = match &opts.handler_url {
        Some(endpoint) => format!("http: {{ url: \"{endpoint}\" }}"),
        None => "noop: true".to_owned(),
    };
    let settings = match bin.label {
        "icq" => opts.icq_settings.as_ref(),
        _ => opts.icq_baseline_settings.as_ref(),
    };
    let settings = settings.map_or_else(String::new, |s| format!("    settings: {s}\n"));
    std::fs::write(
        &config,
        format!(
            "sources:\n  - name: bench\n    url: {url}\n{settings}handlers:\n  bench.noop:\n    {handler}\n"
        ),
    )?;
    let start = Instant::now();
    let mut children = Vec::new();
    for n in 0..replicas.max(1) {
        let stderr_path = dir.join(format!("work{n}.stderr"));
        let stdout = std::fs::File::create(dir.join(format!("work{n}.stdout")))?;
        let stderr = std::fs::File::create(&stderr_path)?;
        let mut cmd = tokio::process::Command::new(&bin.path);
        cmd.arg("work")
            .arg("--until-idle")
            .arg("--config")
            .arg(&config)
            .current_dir(dir)
            .env("NO_COLOR", "1")
            .env_remove("DATABASE_URL")
            .env_remove("ICQ_CONFIG")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {} work", bin.path.display()))?;
        children.push((child, stderr_path));
    }
    for (mut child, stderr_path) in children {
        let left = opts.timeout().saturating_sub(start.elapsed());
        let status = match tokio::time::timeout(left, child.wait()).await {
            Ok(status) => status?,
            Err(_) => {
                child.kill().await.ok();
                bail!(
                    "{} work --until-idle did not exit within {:?}{}",
                    bin.label,
                    opts.timeout(),
                    tail(&stderr_path)
                );
            }
        };
        if !status.success() {
            bail!(
                "{} work --until-idle failed ({status}){}",
                bin.label,
                tail(&stderr_path)
            );
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(20);
    if lines.is_empty() {
        String::new()
    } else {
        format!("; its stderr ends:\n{}", lines[from..].join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_3_leaves_out_the_version_4_section_alone() {
        let ddl = "CREATE TABLE t (a int);\n\n-- Schema version 4: more.\nALTER TABLE t ADD b int;\nCREATE TABLE q (x int);\n\n-- Wakes.\nCREATE TRIGGER n;\n";
        assert_eq!(
            without_version_4(ddl).unwrap(),
            "CREATE TABLE t (a int);\n\n\n-- Wakes.\nCREATE TRIGGER n;\n"
        );
        assert!(without_version_4("CREATE TABLE t (a int);\n").is_err());
    }
}
