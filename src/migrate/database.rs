//! Migrations against a database: [`info`], [`run`] and [`revert`], with sqlx's own
//! bookkeeping (`_sqlx_migrations`, checksums, the migration lock), so that sqlx-cli and
//! icq can take over from each other at any point.
//!
//! The steps are sqlx-cli 0.9's: a dirty database (a migration that failed half-way on an
//! engine without transactional DDL) is refused, a migration applied but missing from the
//! directory is refused, and one whose file changed since it was applied is refused. Two
//! rules are stricter than sqlx-cli's on purpose:
//!
//! - `revert` without a target undoes the *latest* applied migration, and refuses when that
//!   one has no `.down.sql` (sqlx-cli would silently undo an older reversible one beneath it);
//!   with a target, every migration above it must be reversible before anything is undone.
//! - `info` reports a migration applied in the database but missing from the directory as a
//!   line of its own instead of leaving it out.
//!
//! One direct connection, not a pool, so a refused connection fails at once with its cause.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use sqlx::Connection;
#[cfg(feature = "sqlite")]
use sqlx::migrate::MigrateDatabase;
use sqlx::migrate::{Migrate, Migration, Migrator};
#[cfg(feature = "sqlite")]
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};

use super::{MIGRATIONS_TABLE, SQLSERVER_DIR, scan};
use crate::error::{Error, Result};
use crate::ident::Engine;
use crate::redact::{redact_in, redact_url};

/// What [`run`] or [`revert`] may do.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let tmp = tempfile::tempdir()?;
/// # let dir = tmp.path().join("migrations");
/// # let url = format!("sqlite://{}", tmp.path().join("shop.db").display());
/// # icq::migrate::add(&icq::migrate::AddOptions { engine: icq::Engine::Sqlite, table: Default::default(), dir: dir.clone(), kind: Some(icq::migrate::MigrationKind::Reversible), versioning: icq::migrate::Versioning::Sequential })?;
/// // `dir` holds icq's reversible SQLite migration 0001; `url` names a SQLite file.
/// use icq::migrate::{MigrateOptions, run};
///
/// std::fs::write(dir.join("0002_orders.up.sql"), "CREATE TABLE orders (id INTEGER);")?;
/// std::fs::write(dir.join("0002_orders.down.sql"), "DROP TABLE orders;")?;
///
/// let up_to_1 = MigrateOptions { target_version: Some(1), ..MigrateOptions::default() };
/// assert_eq!(run(&url, &dir, &up_to_1).await?.skipped, [2]); // `--target-version 1`
/// let dry_run = MigrateOptions { dry_run: true, target_version: None }; // `--dry-run`
/// let would = run(&url, &dir, &dry_run).await?;
/// assert_eq!((would.applied[0].version, would.already_applied), (2, 1));
/// assert_eq!(run(&url, &dir, &dry_run).await?.applied.len(), 1); // 2 is still pending
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MigrateOptions {
    /// Report what would be applied or reverted, and change nothing.
    pub dry_run: bool,
    /// [`run`]: apply up to and including this version. [`revert`]: undo everything above
    /// this version (`0` undoes all). `None`: [`run`] applies everything pending, [`revert`]
    /// undoes the latest applied migration only.
    pub target_version: Option<i64>,
}

/// A migration that [`run`] applied or [`revert`] undid (or would have, under
/// [`MigrateOptions::dry_run`]).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let tmp = tempfile::tempdir()?;
/// # let dir = tmp.path().join("migrations");
/// # let url = format!("sqlite://{}", tmp.path().join("shop.db").display());
/// # icq::migrate::add(&icq::migrate::AddOptions { engine: icq::Engine::Sqlite, table: Default::default(), dir: dir.clone(), kind: Some(icq::migrate::MigrationKind::Reversible), versioning: icq::migrate::Versioning::Sequential })?;
/// // `dir` holds icq's reversible SQLite migration 0001; `url` names a SQLite file.
/// let report = icq::migrate::run(&url, &dir, &Default::default()).await?;
/// let applied = &report.applied[0];
/// assert_eq!((applied.version, applied.description.as_str()), (1, "add internal commands"));
/// assert!(applied.elapsed_ms >= 0.0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Applied {
    /// Its version.
    pub version: i64,
    /// Its description as sqlx records it (underscores read as spaces).
    pub description: String,
    /// How long its SQL took, in milliseconds (0 under a dry run).
    pub elapsed_ms: f64,
}

/// What [`run`] did.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let tmp = tempfile::tempdir()?;
/// # let dir = tmp.path().join("migrations");
/// # let url = format!("sqlite://{}", tmp.path().join("shop.db").display());
/// # icq::migrate::add(&icq::migrate::AddOptions { engine: icq::Engine::Sqlite, table: Default::default(), dir: dir.clone(), kind: Some(icq::migrate::MigrationKind::Reversible), versioning: icq::migrate::Versioning::Sequential })?;
/// // `dir` holds icq's reversible SQLite migration 0001; `url` names a SQLite file.
/// use icq::migrate::run;
///
/// let first = run(&url, &dir, &Default::default()).await?;
/// assert_eq!((first.applied.len(), first.already_applied, first.dry_run), (1, 0, false));
/// let second = run(&url, &dir, &Default::default()).await?;
/// assert_eq!((second.applied.len(), second.already_applied), (0, 1));
/// assert!(second.database.starts_with("sqlite://")); // the URL, its password masked
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RunReport {
    /// The database, its password masked.
    pub database: String,
    /// Whether this was a dry run (`applied` lists what would have been applied).
    pub dry_run: bool,
    /// The migrations applied now, in order.
    pub applied: Vec<Applied>,
    /// How many of the directory's migrations were already applied before.
    pub already_applied: usize,
    /// Pending migrations above `--target-version`, left for later.
    pub skipped: Vec<i64>,
}

/// What [`revert`] did.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let tmp = tempfile::tempdir()?;
/// # let dir = tmp.path().join("migrations");
/// # let url = format!("sqlite://{}", tmp.path().join("shop.db").display());
/// # icq::migrate::add(&icq::migrate::AddOptions { engine: icq::Engine::Sqlite, table: Default::default(), dir: dir.clone(), kind: Some(icq::migrate::MigrationKind::Reversible), versioning: icq::migrate::Versioning::Sequential })?;
/// # icq::migrate::run(&url, &dir, &Default::default()).await?;
/// // `dir` holds icq's reversible SQLite migration 0001, applied to the database at `url`.
/// let report = icq::migrate::revert(&url, &dir, &Default::default()).await?;
/// assert_eq!(report.reverted.iter().map(|m| m.version).collect::<Vec<_>>(), [1]);
/// assert!(!report.dry_run);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RevertReport {
    /// The database, its password masked.
    pub database: String,
    /// Whether this was a dry run (`reverted` lists what would have been undone).
    pub dry_run: bool,
    /// The migrations undone, latest first.
    pub reverted: Vec<Applied>,
}

/// Where one migration stands in the database (`icq migrate info`).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let tmp = tempfile::tempdir()?;
/// # let dir = tmp.path().join("migrations");
/// # let url = format!("sqlite://{}", tmp.path().join("shop.db").display());
/// # icq::migrate::add(&icq::migrate::AddOptions { engine: icq::Engine::Sqlite, table: Default::default(), dir: dir.clone(), kind: Some(icq::migrate::MigrationKind::Reversible), versioning: icq::migrate::Versioning::Sequential })?;
/// # drop(sqlx::SqlitePool::connect(&format!("{url}?mode=rwc")).await?);
/// // `dir` holds icq's reversible SQLite migration 0001; `url` names a SQLite file.
/// use icq::migrate::{MigrationState, info, run};
///
/// assert_eq!(info(&url, &dir).await?.migrations[0].state, MigrationState::Pending);
/// run(&url, &dir, &Default::default()).await?;
/// assert_eq!(info(&url, &dir).await?.migrations[0].state, MigrationState::Installed);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MigrationState {
    /// Applied, and the file is unchanged since.
    Installed,
    /// In the directory, not applied yet.
    Pending,
    /// Applied, but the file changed since (sqlx refuses to run until it is restored).
    ChecksumMismatch,
    /// Applied, then failed half-way (an engine without transactional DDL): fix the schema
    /// by hand and delete its `_sqlx_migrations` row.
    Dirty,
    /// Applied in the database, but no file in the directory has its version.
    MissingFile,
}

impl MigrationState {
    /// The word `icq migrate info` prints, as sqlx-cli does.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::migrate::MigrationState;
    ///
    /// assert_eq!(MigrationState::Pending.label(), "pending");
    /// assert_eq!(MigrationState::ChecksumMismatch.label(), "installed (different checksum)");
    /// ```
    pub fn label(self) -> &'static str {
        match self {
            MigrationState::Installed => "installed",
            MigrationState::Pending => "pending",
            MigrationState::ChecksumMismatch => "installed (different checksum)",
            MigrationState::Dirty => "installed (dirty: failed half-way)",
            MigrationState::MissingFile => "installed (file missing)",
        }
    }
}

/// One line of [`info`].
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let tmp = tempfile::tempdir()?;
/// # let dir = tmp.path().join("migrations");
/// # let url = format!("sqlite://{}", tmp.path().join("shop.db").display());
/// # icq::migrate::add(&icq::migrate::AddOptions { engine: icq::Engine::Sqlite, table: Default::default(), dir: dir.clone(), kind: Some(icq::migrate::MigrationKind::Reversible), versioning: icq::migrate::Versioning::Sequential })?;
/// # icq::migrate::run(&url, &dir, &Default::default()).await?;
/// // `dir` holds icq's reversible SQLite migration 0001, applied to the database at `url`.
/// use icq::migrate::{MigrationState, info};
///
/// # let up = dir.read_dir()?.flatten().map(|e| e.path()).find(|p| p.to_string_lossy().ends_with(".up.sql")).unwrap();
/// std::fs::write(&up, "-- edited after it was applied")?; // the .up.sql of version 1
/// let status = &info(&url, &dir).await?.migrations[0];
/// assert_eq!((status.version, status.state), (1, MigrationState::ChecksumMismatch));
/// assert!(status.reversible);
/// assert_ne!(status.applied_checksum, status.local_checksum);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MigrationStatus {
    /// Its version.
    pub version: i64,
    /// Its description (empty for [`MigrationState::MissingFile`]).
    pub description: String,
    /// Where it stands.
    pub state: MigrationState,
    /// Whether the directory has a `.down.sql` for it, so [`revert`] can undo it.
    pub reversible: bool,
    /// The first 8 bytes of the applied checksum, in hex, when it differs from the file's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub applied_checksum: Option<String>,
    /// The first 8 bytes of the file's checksum, in hex, when it differs from the applied one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_checksum: Option<String>,
}

/// What [`info`] found.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let tmp = tempfile::tempdir()?;
/// # let dir = tmp.path().join("migrations");
/// # let url = format!("sqlite://{}", tmp.path().join("shop.db").display());
/// # icq::migrate::add(&icq::migrate::AddOptions { engine: icq::Engine::Sqlite, table: Default::default(), dir: dir.clone(), kind: Some(icq::migrate::MigrationKind::Reversible), versioning: icq::migrate::Versioning::Sequential })?;
/// # icq::migrate::run(&url, &dir, &Default::default()).await?;
/// // `dir` holds icq's reversible SQLite migration 0001, applied to the database at `url`.
/// let report = icq::migrate::info(&url, &dir).await?;
/// for m in &report.migrations {
///     println!("{}/{} {}", m.version, m.state.label(), m.description); // 1/installed add …
/// }
/// let json = serde_json::to_value(&report)?; // `icq migrate info --format json`
/// assert_eq!(json["migrations"][0]["state"], "installed");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct InfoReport {
    /// The database, its password masked.
    pub database: String,
    /// Every migration of the directory and every applied one, by version.
    pub migrations: Vec<MigrationStatus>,
}

/// Applies the pending migrations of `dir` to the database at `url` (all of them, or up to
/// [`MigrateOptions::target_version`]), each in its own transaction where the engine allows,
/// holding sqlx's migration lock. A SQLite database file that does not exist yet is created
/// (in WAL mode, like `sqlx database create`), unless this is a dry run.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let tmp = tempfile::tempdir()?;
/// # let dir = tmp.path().join("migrations");
/// # let url = format!("sqlite://{}", tmp.path().join("shop.db").display());
/// # icq::migrate::add(&icq::migrate::AddOptions { engine: icq::Engine::Sqlite, table: Default::default(), dir: dir.clone(), kind: Some(icq::migrate::MigrationKind::Reversible), versioning: icq::migrate::Versioning::Sequential })?;
/// // `dir` holds icq's reversible SQLite migration 0001; `url` names a SQLite file.
/// let report = icq::migrate::run(&url, &dir, &Default::default()).await?;
/// assert_eq!(report.applied.len(), 1);
/// // The table is there: a queue can connect.
/// let queue = icq::Queue::connect("shop", &url, &Default::default(), &Default::default()).await?;
/// # queue.close().await;
/// # Ok(())
/// # }
/// ```
pub async fn run(url: &str, dir: &Path, options: &MigrateOptions) -> Result<RunReport> {
    let migrator = migrator_for(url, dir).await?;
    if let Some(target) = options.target_version
        && !migrator.version_exists(target)
    {
        return Err(Error::invalid(format!(
            "--target-version {target} is not a migration in {}",
            dir.display()
        )));
    }
    match with_connection(url, !options.dry_run, Operation::Run(&migrator, *options)).await? {
        Outcome::Run(report) => Ok(report),
        _ => unreachable!("a run yields a run report"),
    }
}

/// Undoes applied migrations with their `.down.sql` files: the latest one, or every one
/// above [`MigrateOptions::target_version`], latest first, holding sqlx's migration lock.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let tmp = tempfile::tempdir()?;
/// # let dir = tmp.path().join("migrations");
/// # let url = format!("sqlite://{}", tmp.path().join("shop.db").display());
/// # icq::migrate::add(&icq::migrate::AddOptions { engine: icq::Engine::Sqlite, table: Default::default(), dir: dir.clone(), kind: Some(icq::migrate::MigrationKind::Reversible), versioning: icq::migrate::Versioning::Sequential })?;
/// # icq::migrate::run(&url, &dir, &Default::default()).await?;
/// // `dir` holds icq's reversible SQLite migration 0001, applied to the database at `url`.
/// use icq::migrate::{MigrateOptions, revert};
///
/// let all = MigrateOptions { target_version: Some(0), ..MigrateOptions::default() }; // undo all
/// revert(&url, &dir, &all).await?;
/// let missing = icq::Queue::connect("shop", &url, &Default::default(), &Default::default()).await;
/// assert!(matches!(missing, Err(icq::Error::TableMissing { .. })));
/// # Ok(())
/// # }
/// ```
pub async fn revert(url: &str, dir: &Path, options: &MigrateOptions) -> Result<RevertReport> {
    let migrator = migrator_for(url, dir).await?;
    if let Some(target) = options.target_version
        && target != 0
        && !migrator.version_exists(target)
    {
        return Err(Error::invalid(format!(
            "--target-version {target} is not a migration in {} (0 reverts everything)",
            dir.display()
        )));
    }
    match with_connection(url, false, Operation::Revert(&migrator, *options)).await? {
        Outcome::Revert(report) => Ok(report),
        _ => unreachable!("a revert yields a revert report"),
    }
}

/// Lists every migration of `dir` and every one applied to the database at `url`, with
/// where each stands. Like `sqlx migrate info`, this creates the empty `_sqlx_migrations`
/// table when the database has none yet; it changes nothing else. See [`InfoReport`]'s
/// and [`MigrationState`]'s examples.
pub async fn info(url: &str, dir: &Path) -> Result<InfoReport> {
    let migrator = migrator_for(url, dir).await?;
    match with_connection(url, false, Operation::Info(&migrator)).await? {
        Outcome::Info(report) => Ok(report),
        _ => unreachable!("info yields an info report"),
    }
}

/// Checks the URL's engine and the directory, and resolves the directory's migrations.
async fn migrator_for(url: &str, dir: &Path) -> Result<Migrator> {
    let engine = Engine::from_url(url)?;
    if engine == Engine::SqlServer {
        return Err(sql_server_unsupported());
    }
    if !dir.is_dir() {
        return Err(Error::invalid(format!(
            "migrations directory {} does not exist; write the migration first with \
             `icq migrate add --engine {engine}`, or pass --dir",
            dir.display()
        )));
    }
    let files = scan(dir)?;
    refuse_duplicate_versions(&files, dir)?;
    if let Some(foreign) = files
        .into_iter()
        .find(|m| m.icq.as_ref().is_some_and(|h| h.engine != engine))
    {
        return Err(Error::invalid(format!(
            "{} was written for {}, but {} is a {engine} database; pass --dir with the \
             {engine} migrations",
            foreign.path.display(),
            foreign.icq.map_or("another engine", |h| h.engine.name()),
            redact_url(url),
        )));
    }
    Ok(Migrator::new(dir.to_path_buf()).await?)
}

/// Two files that apply (or two that revert) one version: sqlx would apply the first and
/// then fail or report the version as applied, so neither `run` nor `info` would be true to
/// the directory. Refused naming both files, as sqlx-cli refuses.
fn refuse_duplicate_versions(files: &[super::ExistingMigration], dir: &Path) -> Result<()> {
    let mut seen: BTreeMap<(i64, bool), &Path> = BTreeMap::new();
    for file in files {
        let key = (file.version, file.migration_type.is_down_migration());
        if let Some(first) = seen.insert(key, &file.path) {
            return Err(Error::invalid(format!(
                "{} and {} both have version {}; each version must be one migration \
                 (rename one of them to a new version), so nothing was done in {}",
                first.display(),
                file.path.display(),
                file.version,
                dir.display()
            )));
        }
    }
    Ok(())
}

fn sql_server_unsupported() -> Error {
    Error::Unsupported(format!(
        "sqlx cannot run T-SQL, so icq cannot apply migrations to SQL Server; apply \
         {SQLSERVER_DIR}/ with sqlcmd -I, DbUp or Flyway"
    ))
}

/// One of the three things done over a connection.
#[derive(Clone, Copy)]
enum Operation<'m> {
    Info(&'m Migrator),
    Run(&'m Migrator, MigrateOptions),
    Revert(&'m Migrator, MigrateOptions),
}

/// What an [`Operation`] produced: the report of the same name.
enum Outcome {
    Info(InfoReport),
    Run(RunReport),
    Revert(RevertReport),
}

/// Connects to `url` with the engine's own connection type and performs `operation`.
/// `create_sqlite` creates a missing SQLite file; otherwise a missing file is an error
/// naming it.
#[cfg_attr(not(feature = "sqlite"), allow(unused_variables))]
async fn with_connection(
    url: &str,
    create_sqlite: bool,
    operation: Operation<'_>,
) -> Result<Outcome> {
    let url = &crate::engine::url::for_driver(url);
    let database = redact_url(url);
    let connecting = format!("connecting to {database}");
    let bad_url = |err: sqlx::Error| {
        Error::invalid(format!(
            "invalid database URL {database}: {}",
            redact_in(&err.to_string(), url)
        ))
    };
    // Each engine's arm exists only in a build with its feature; the others fall to the
    // last arm, which names the feature to enable.
    match Engine::from_url(url)? {
        #[cfg(feature = "postgres")]
        Engine::Postgres => {
            // The writable server of a URL listing several hosts (libpq's forms), as
            // `icq work` would pick it; a single host as written.
            let options = crate::engine::postgres::connect_options(url)
                .await
                .map_err(|err| match err {
                    Error::Database {
                        cause: cause @ sqlx::Error::Configuration(_),
                        ..
                    } => bad_url(cause),
                    other => other,
                })?;
            perform::<sqlx::PgConnection>(options, operation, connecting, &database).await
        }
        #[cfg(feature = "mysql")]
        Engine::Mysql => {
            // The first node of a URL listing several hosts that can take writes, as
            // `icq work` would pick it; a single host as written.
            let options = crate::engine::mysql::connect::connect_options(url)
                .await
                .map_err(|err| match err {
                    Error::Database {
                        cause: cause @ sqlx::Error::Configuration(_),
                        ..
                    } => bad_url(cause),
                    other => other,
                })?;
            perform::<sqlx::MySqlConnection>(options, operation, connecting, &database).await
        }
        Engine::SqlServer => Err(sql_server_unsupported()),
        #[cfg(feature = "sqlite")]
        Engine::Sqlite => {
            let mut options = url.parse::<SqliteConnectOptions>().map_err(bad_url)?;
            let exists = sqlx::Sqlite::database_exists(url)
                .await
                .map_err(Error::db(connecting.clone()))?;
            // `?mode=rwc` asks for the file to be created whatever the operation.
            let asks_to_create = url.contains("mode=rwc");
            if !exists && create_sqlite {
                options = options
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal);
            } else if !exists && !asks_to_create {
                return Err(Error::invalid(
                    "the SQLite database file does not exist yet; `icq migrate run` creates it",
                ));
            }
            perform::<sqlx::SqliteConnection>(options, operation, connecting, &database).await
        }
        #[allow(unreachable_patterns, reason = "reached without an engine feature")]
        absent => Err(Error::engine_not_built(absent)),
    }
}

async fn perform<C>(
    options: C::Options,
    operation: Operation<'_>,
    connecting: String,
    database: &str,
) -> Result<Outcome>
where
    C: Connection + Migrate,
{
    let mut conn = C::connect_with(&options)
        .await
        .map_err(Error::db(connecting))?;
    let database = database.to_owned();
    let outcome = match operation {
        Operation::Info(migrator) => info_on(&mut conn, migrator, database)
            .await
            .map(Outcome::Info),
        // sqlx's migration lock (PostgreSQL advisory lock, MySQL `GET_LOCK`, nothing on
        // SQLite) is held around a real run or revert, and released whatever happened.
        Operation::Run(migrator, options) => match lock(&mut conn, !options.dry_run).await {
            Ok(()) => {
                let report = run_on(&mut conn, migrator, options, database).await;
                unlock(&mut conn, !options.dry_run, report)
                    .await
                    .map(Outcome::Run)
            }
            Err(err) => Err(err),
        },
        Operation::Revert(migrator, options) => match lock(&mut conn, !options.dry_run).await {
            Ok(()) => {
                let report = revert_on(&mut conn, migrator, options, database).await;
                unlock(&mut conn, !options.dry_run, report)
                    .await
                    .map(Outcome::Revert)
            }
            Err(err) => Err(err),
        },
    };
    // Closing checkpoints a SQLite WAL, so the schema is in the database file itself.
    let _ = conn.close().await;
    outcome
}

async fn lock<C: Migrate>(conn: &mut C, wanted: bool) -> Result<()> {
    if wanted {
        conn.lock().await?;
    }
    Ok(())
}

async fn unlock<C: Migrate, T>(conn: &mut C, locked: bool, result: Result<T>) -> Result<T> {
    if locked {
        let unlocked = conn.unlock().await;
        let value = result?;
        unlocked?;
        return Ok(value);
    }
    result
}

/// The applied migrations by version, after making sure the bookkeeping table exists and
/// refusing a dirty database.
async fn applied<C: Migrate>(
    conn: &mut C,
    refuse_dirty: bool,
) -> Result<(BTreeMap<i64, Vec<u8>>, Option<i64>)> {
    conn.ensure_migrations_table(MIGRATIONS_TABLE).await?;
    let dirty = conn.dirty_version(MIGRATIONS_TABLE).await?;
    if refuse_dirty && let Some(version) = dirty {
        return Err(sqlx::migrate::MigrateError::Dirty(version).into());
    }
    let applied = conn
        .list_applied_migrations(MIGRATIONS_TABLE)
        .await?
        .into_iter()
        .map(|m| (m.version, m.checksum.into_owned()))
        .collect();
    Ok((applied, dirty))
}

/// Refuses applied migrations whose file is gone or changed (sqlx's own checks).
fn check_applied(applied: &BTreeMap<i64, Vec<u8>>, migrator: &Migrator) -> Result<()> {
    for (&version, checksum) in applied {
        match up_migration(migrator, version) {
            None => return Err(sqlx::migrate::MigrateError::VersionMissing(version).into()),
            Some(m) if m.checksum.as_ref() != checksum.as_slice() => {
                return Err(sqlx::migrate::MigrateError::VersionMismatch(version).into());
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn up_migration(migrator: &Migrator, version: i64) -> Option<&Migration> {
    migrator
        .iter()
        .find(|m| m.version == version && !m.migration_type.is_down_migration())
}

fn down_migration(migrator: &Migrator, version: i64) -> Option<&Migration> {
    migrator
        .iter()
        .find(|m| m.version == version && m.migration_type.is_down_migration())
}

fn step(migration: &Migration, elapsed: Duration) -> Applied {
    Applied {
        version: migration.version,
        description: migration.description.to_string(),
        elapsed_ms: elapsed.as_secs_f64() * 1000.0,
    }
}

async fn run_on<C: Migrate>(
    conn: &mut C,
    migrator: &Migrator,
    options: MigrateOptions,
    database: String,
) -> Result<RunReport> {
    let (applied, _) = applied(conn, true).await?;
    check_applied(&applied, migrator)?;
    let latest = applied.keys().next_back().copied();
    if let (Some(target), Some(latest)) = (options.target_version, latest)
        && target < latest
    {
        return Err(Error::invalid(format!(
            "--target-version {target} is older than the latest applied migration {latest}; \
             use `icq migrate revert --target-version {target}` to go back"
        )));
    }
    let mut report = RunReport {
        database,
        dry_run: options.dry_run,
        applied: Vec::new(),
        already_applied: 0,
        skipped: Vec::new(),
    };
    for migration in migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
    {
        if applied.contains_key(&migration.version) {
            report.already_applied += 1;
        } else if options
            .target_version
            .is_some_and(|target| migration.version > target)
        {
            report.skipped.push(migration.version);
        } else if options.dry_run {
            report.applied.push(step(migration, Duration::ZERO));
        } else {
            let elapsed = conn.apply(MIGRATIONS_TABLE, migration).await?;
            report.applied.push(step(migration, elapsed));
        }
    }
    Ok(report)
}

async fn revert_on<C: Migrate>(
    conn: &mut C,
    migrator: &Migrator,
    options: MigrateOptions,
    database: String,
) -> Result<RevertReport> {
    let (applied, _) = applied(conn, true).await?;
    check_applied(&applied, migrator)?;
    let latest = applied.keys().next_back().copied();
    let to_undo: Vec<i64> = match (options.target_version, latest) {
        (_, None) => Vec::new(),
        (Some(target), Some(latest)) if target > latest => {
            return Err(Error::invalid(format!(
                "--target-version {target} is newer than the latest applied migration \
                 {latest}; nothing to revert"
            )));
        }
        (Some(target), Some(_)) => applied
            .keys()
            .rev()
            .copied()
            .filter(|&v| v > target)
            .collect(),
        (None, Some(latest)) => vec![latest],
    };
    // Check every step before undoing any: a half-done revert is worse than none.
    let downs = to_undo
        .iter()
        .map(|&version| {
            down_migration(migrator, version).ok_or_else(|| {
                let description = up_migration(migrator, version)
                    .map_or_else(String::new, |m| format!(" ({})", m.description));
                Error::Refused(format!(
                    "migration {version}{description} is not reversible: it has no \
                     .down.sql file, so nothing was reverted"
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut report = RevertReport {
        database,
        dry_run: options.dry_run,
        reverted: Vec::new(),
    };
    for migration in downs {
        let elapsed = if options.dry_run {
            Duration::ZERO
        } else {
            conn.revert(MIGRATIONS_TABLE, migration).await?
        };
        report.reverted.push(step(migration, elapsed));
    }
    Ok(report)
}

async fn info_on<C: Migrate>(
    conn: &mut C,
    migrator: &Migrator,
    database: String,
) -> Result<InfoReport> {
    let (applied, dirty) = applied(conn, false).await?;
    let mut migrations: Vec<MigrationStatus> = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| {
            let reversible = down_migration(migrator, m.version).is_some();
            let mut status = MigrationStatus {
                version: m.version,
                description: m.description.to_string(),
                state: MigrationState::Pending,
                reversible,
                applied_checksum: None,
                local_checksum: None,
            };
            if let Some(checksum) = applied.get(&m.version) {
                if dirty == Some(m.version) {
                    status.state = MigrationState::Dirty;
                } else if checksum.as_slice() != m.checksum.as_ref() {
                    status.state = MigrationState::ChecksumMismatch;
                    status.applied_checksum = Some(short_checksum(checksum));
                    status.local_checksum = Some(short_checksum(&m.checksum));
                } else {
                    status.state = MigrationState::Installed;
                }
            }
            status
        })
        .collect();
    for &version in applied.keys() {
        if up_migration(migrator, version).is_none() {
            migrations.push(MigrationStatus {
                version,
                description: String::new(),
                state: if dirty == Some(version) {
                    MigrationState::Dirty
                } else {
                    MigrationState::MissingFile
                },
                reversible: false,
                applied_checksum: None,
                local_checksum: None,
            });
        }
    }
    migrations.sort_by_key(|m| m.version);
    Ok(InfoReport {
        database,
        migrations,
    })
}

fn short_checksum(checksum: &[u8]) -> String {
    checksum
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}
