//! Migration files that sqlx-cli understands, and applying them with sqlx's migrator.
//!
//! `icq migrate add` writes the commands table's DDL (from [`crate::schema`]) as
//! `<version>_add_internal_commands.sql`, or as an `.up.sql` + `.down.sql` pair, using
//! sqlx-cli 0.9's naming and version rules so that `sqlx migrate run` applies the file and
//! `sqlx migrate add` continues the sequence after it:
//!
//! - the version is a UTC `YYYYMMDDHHMMSS` timestamp, unless the directory is already
//!   sequential (its last two versions differ by one, or its only version is 0 or 1), in
//!   which case it is the next number, zero-padded to four digits (`0003`);
//!   [`Versioning::Timestamp`] and [`Versioning::Sequential`] force either;
//! - the kind follows the directory's last migration (reversible if it was) unless forced;
//! - the new version never collides with, nor sorts before, one already in the directory:
//!   it is bumped past the latest instead.
//!
//! Two details differ from sqlx-cli on purpose: sqlx-cli 0.9 compares the last two *files*,
//! so after a sequential reversible pair (`0001_a.up.sql`, `0001_a.down.sql`) it falls back
//! to a timestamp; icq compares the last two *versions* and continues with `0002`. And
//! sqlx-cli may reuse a timestamp within the same second; icq bumps it.
//!
//! Every generated file starts with a header line ([`HEADER_PREFIX`]) naming its engine and
//! table. icq never overwrites a file, and refuses to put one engine's migration into a
//! directory that already holds another engine's (sqlx would run both against one
//! database).
//!
//! What `add` writes depends on what the directory already holds for the table
//! ([`PlanAction`]): nothing yet → the whole table at [`crate::schema::SCHEMA_VERSION`] 4
//! (`<version>_add_internal_commands.sql`); icq's version-1, 2 or 3 migrations
//! (written by an older icq) → the upgrade `<version>_icq_schema_v4.sql`
//! ([`crate::schema::render_upgrade_from`]); version 4 already → nothing (it is up to
//! date). A file's version is read from its text
//! ([`schema_version_of`]), not trusted to its name.
//!
//! [`run`], [`revert`] and [`info`] work on a database with sqlx's migrator types, so the
//! `_sqlx_migrations` bookkeeping and checksums are exactly those sqlx-cli keeps: either
//! tool can take over from the other.
//!
//! ```no_run
//! use icq::migrate::{self, AddOptions, MigrateOptions, Versioning};
//! use icq::{Engine, TableName};
//!
//! # async fn demo() -> icq::Result<()> {
//! let plan = migrate::add(&AddOptions {
//!     engine: Engine::Postgres,
//!     table: TableName::default(),
//!     dir: migrate::default_dir(Engine::Postgres),
//!     kind: None, // like the directory's last migration
//!     versioning: Versioning::Inferred,
//! })?;
//! println!("wrote {}", plan.files[0].path.display());
//!
//! let url = "postgres://app@localhost/orders";
//! let report = migrate::run(url, "migrations".as_ref(), &MigrateOptions::default()).await?;
//! println!("applied {} migration(s)", report.applied.len());
//!
//! for migration in migrate::info(url, "migrations".as_ref()).await?.migrations {
//!     println!("{}/{} {}", migration.version, migration.state.label(), migration.description);
//! }
//! # Ok(())
//! # }
//! ```

mod database;

use std::collections::BTreeSet;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use chrono::{DateTime, Utc};
use sqlx::migrate::MigrationType;

use crate::error::{Error, Result};
use crate::ident::{Engine, TableName};
use crate::schema::SCHEMA_VERSION;

pub use database::{
    Applied, InfoReport, MigrateOptions, MigrationState, MigrationStatus, RevertReport, RunReport,
    info, revert, run,
};

/// The description part of the file name (`<version>_add_internal_commands.sql`).
///
/// # Examples
///
/// ```
/// # let tmp = tempfile::tempdir()?;
/// use icq::migrate::{AddOptions, DESCRIPTION, Versioning, plan};
/// use icq::{Engine, TableName};
///
/// let opts = AddOptions {
///     engine: Engine::Sqlite,
///     table: TableName::default(),
///     dir: tmp.path().join("migrations"),
///     kind: None,
///     versioning: Versioning::Inferred,
/// };
/// let plan = plan(&opts, chrono::Utc::now())?;
/// let file_name = plan.files[0].path.file_name().unwrap().to_string_lossy().into_owned();
/// assert_eq!(file_name, format!("{}_{DESCRIPTION}.sql", plan.version));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const DESCRIPTION: &str = "add_internal_commands";

/// The description of the upgrade from schema version 1 to 2
/// (`<version>_icq_schema_v2.sql`), which `icq migrate add` writes into a directory that
/// holds a version-1 [`DESCRIPTION`] migration.
///
/// # Examples
///
/// ```
/// # let tmp = tempfile::tempdir()?;
/// use icq::migrate::{AddOptions, PlanAction, UPGRADE_V2_DESCRIPTION, Versioning, plan};
/// use icq::{Engine, TableName};
///
/// let dir = tmp.path().join("migrations");
/// std::fs::create_dir(&dir)?;
/// // What icq 0.x wrote before schema version 2.
/// let v1 = icq::schema::render_v1(Engine::Sqlite, &TableName::default()).up;
/// let header = "-- icq migration: engine=sqlite table=InternalCommands\n";
/// std::fs::write(dir.join("0001_add_internal_commands.sql"), format!("{header}{v1}"))?;
///
/// let opts = AddOptions {
///     engine: Engine::Sqlite,
///     table: TableName::default(),
///     dir,
///     kind: None,
///     versioning: Versioning::Inferred,
/// };
/// let upgrade = plan(&opts, chrono::Utc::now())?;
/// assert!(matches!(upgrade.action, PlanAction::Upgrade { .. }));
/// let name = upgrade.files[0].path.file_name().unwrap().to_string_lossy().into_owned();
/// assert_eq!(name, format!("0002_{}.sql", icq::migrate::UPGRADE_V4_DESCRIPTION));
/// upgrade.write()?;
/// assert!(matches!(plan(&opts, chrono::Utc::now())?.action, PlanAction::UpToDate { .. }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const UPGRADE_V2_DESCRIPTION: &str = "icq_schema_v2";

/// The description of the upgrade to schema version 3 (`<version>_icq_schema_v3.sql`),
/// which an earlier `icq migrate add` wrote into a directory whose icq migrations left the
/// table at version 1 or 2.
pub const UPGRADE_V3_DESCRIPTION: &str = "icq_schema_v3";

/// The description of the upgrade to schema version 4 (`<version>_icq_schema_v4.sql`),
/// which `icq migrate add` writes into a directory whose icq migrations leave the table at
/// version 1, 2 or 3.
pub const UPGRADE_V4_DESCRIPTION: &str = "icq_schema_v4";

/// The directory migrations go to by default (sqlx-cli's default too).
///
/// # Examples
///
/// ```
/// use icq::Engine;
/// use icq::migrate::{DEFAULT_DIR, default_dir};
///
/// assert_eq!(default_dir(Engine::Postgres), std::path::Path::new(DEFAULT_DIR));
/// ```
pub const DEFAULT_DIR: &str = "migrations";

/// The default directory for SQL Server files, which sqlx cannot run: a subdirectory that
/// sqlx ignores, so `sqlx migrate run` on `migrations/` never tries the T-SQL.
///
/// # Examples
///
/// ```
/// use icq::Engine;
/// use icq::migrate::{SQLSERVER_DIR, default_dir};
///
/// assert_eq!(default_dir(Engine::SqlServer), std::path::Path::new(SQLSERVER_DIR));
/// ```
pub const SQLSERVER_DIR: &str = "migrations/sqlserver";

/// The bookkeeping table sqlx and sqlx-cli keep applied migrations in.
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
/// use icq::migrate::MIGRATIONS_TABLE;
///
/// let pool = sqlx::SqlitePool::connect(&url).await?;
/// let sql = format!("SELECT version FROM {MIGRATIONS_TABLE}");
/// let versions: Vec<(i64,)> = sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_all(&pool).await?;
/// assert_eq!(versions, [(1,)]);
/// # Ok(())
/// # }
/// ```
pub const MIGRATIONS_TABLE: &str = "_sqlx_migrations";

/// How every generated file begins: `-- icq migration: engine=postgres table=InternalCommands`.
///
/// # Examples
///
/// ```
/// use icq::migrate::{HEADER_PREFIX, file_sql};
/// use icq::{Engine, TableName};
/// use sqlx::migrate::MigrationType;
///
/// let sql = file_sql(Engine::Mysql, &TableName::default(), MigrationType::Simple);
/// let first_line = sql.lines().next().unwrap();
/// assert_eq!(first_line, format!("{HEADER_PREFIX} engine=mysql table=InternalCommands"));
/// ```
pub const HEADER_PREFIX: &str = "-- icq migration:";

/// The directory `icq migrate add` writes to when `--dir` is not given: [`DEFAULT_DIR`],
/// or [`SQLSERVER_DIR`] for SQL Server (whose T-SQL sqlx must not try to run).
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use icq::Engine;
/// use icq::migrate::default_dir;
///
/// assert_eq!(default_dir(Engine::Sqlite), Path::new("migrations"));
/// assert_eq!(default_dir(Engine::SqlServer), Path::new("migrations/sqlserver"));
/// ```
pub fn default_dir(engine: Engine) -> PathBuf {
    match engine {
        Engine::SqlServer => PathBuf::from(SQLSERVER_DIR),
        _ => PathBuf::from(DEFAULT_DIR),
    }
}

/// Whether a migration is one file, or an up/down pair that `sqlx migrate revert` can undo.
///
/// # Examples
///
/// ```
/// # let tmp = tempfile::tempdir()?;
/// use icq::migrate::{AddOptions, MigrationKind, Versioning, add};
/// use icq::{Engine, TableName};
///
/// let opts = AddOptions {
///     engine: Engine::Sqlite,
///     table: TableName::default(),
///     dir: tmp.path().join("migrations"),
///     kind: Some(MigrationKind::Reversible),
///     versioning: Versioning::Inferred,
/// };
/// let plan = add(&opts)?; // `icq migrate add --reversible`
/// assert_eq!(plan.kind, MigrationKind::Reversible);
/// assert!(plan.files[0].path.to_string_lossy().ends_with("_add_internal_commands.up.sql"));
/// assert!(plan.files[1].path.to_string_lossy().ends_with("_add_internal_commands.down.sql"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MigrationKind {
    /// `<version>_<description>.sql`.
    Simple,
    /// `<version>_<description>.up.sql` and `<version>_<description>.down.sql`.
    Reversible,
}

impl MigrationKind {
    /// The sqlx file types this kind is written as, in writing order.
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::migrate::MigrationKind;
    /// use sqlx::migrate::MigrationType;
    ///
    /// assert_eq!(MigrationKind::Simple.file_types(), [MigrationType::Simple]);
    /// let pair = [MigrationType::ReversibleUp, MigrationType::ReversibleDown];
    /// assert_eq!(MigrationKind::Reversible.file_types(), pair);
    /// ```
    pub fn file_types(self) -> &'static [MigrationType] {
        match self {
            MigrationKind::Simple => &[MigrationType::Simple],
            MigrationKind::Reversible => {
                &[MigrationType::ReversibleUp, MigrationType::ReversibleDown]
            }
        }
    }
}

/// How the version of a new migration is chosen (sqlx-cli's `--timestamp` / `--sequential`).
///
/// # Examples
///
/// ```
/// use icq::migrate::{Versioning, next_version, scan};
///
/// # let tmp = tempfile::tempdir()?;
/// # let dir = tmp.path();
/// std::fs::write(dir.join("0001_create_orders.sql"), "CREATE TABLE orders (id INTEGER);")?;
/// std::fs::write(dir.join("0002_add_status.sql"), "ALTER TABLE orders ADD status TEXT;")?;
/// let existing = scan(dir)?;
/// let now = "2030-01-01T12:00:00Z".parse()?;
/// assert_eq!(next_version(&existing, Versioning::Inferred, now), "0003"); // it is sequential
/// assert_eq!(next_version(&existing, Versioning::Timestamp, now), "20300101120000");
/// assert_eq!(next_version(&[], Versioning::Sequential, now), "0001");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Versioning {
    /// Sequential when the directory already is, a timestamp otherwise.
    #[default]
    Inferred,
    /// Always a `YYYYMMDDHHMMSS` UTC timestamp.
    Timestamp,
    /// Always the last version plus one, zero-padded to four digits.
    Sequential,
}

/// What icq's header line says about a file it generated.
///
/// # Examples
///
/// ```
/// use icq::migrate::{IcqHeader, file_sql};
/// use icq::{Engine, TableName};
///
/// let table = TableName::parse("jobs.Commands")?;
/// let sql = file_sql(Engine::Postgres, &table, sqlx::migrate::MigrationType::Simple);
/// let header = IcqHeader::parse(&sql).expect("icq wrote it");
/// let expected = IcqHeader { engine: Engine::Postgres, table: "jobs.Commands".into(), schema: 4 };
/// assert_eq!(header, expected);
/// # Ok::<(), icq::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IcqHeader {
    /// The engine the SQL was written for.
    pub engine: Engine,
    /// The table it creates or upgrades, as written (`InternalCommands` or `schema.Name`).
    pub table: String,
    /// The table's schema version once the file has run (see [`schema_version_of`]).
    pub schema: u32,
}

impl IcqHeader {
    /// Reads the header from the first line of a file's text, if it is one of icq's, and
    /// the schema version the file's SQL leaves the table at ([`schema_version_of`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use icq::{Engine, migrate::IcqHeader};
    ///
    /// let text = "-- icq migration: engine=sqlite table=InternalCommands\nCREATE TABLE ...";
    /// assert_eq!(IcqHeader::parse(text).map(|h| h.engine), Some(Engine::Sqlite));
    /// assert_eq!(IcqHeader::parse("CREATE TABLE orders (id INTEGER);"), None);
    /// ```
    pub fn parse(text: &str) -> Option<IcqHeader> {
        let rest = text.lines().next()?.strip_prefix(HEADER_PREFIX)?;
        let mut engine = None;
        let mut table = None;
        for field in rest.split_whitespace() {
            match field.split_once('=') {
                Some(("engine", value)) => engine = Engine::from_str(value).ok(),
                Some(("table", value)) => table = Some(value.to_owned()),
                _ => {}
            }
        }
        Some(IcqHeader {
            engine: engine?,
            table: table.unwrap_or_default(),
            schema: schema_version_of(text),
        })
    }

    fn line(engine: Engine, table: &TableName) -> String {
        format!("{HEADER_PREFIX} engine={engine} table={table}\n")
    }
}

/// The schema version of the commands table that an icq migration's (up) SQL leaves
/// behind: 4 when it creates the schedule table (a `CREATE TABLE` of a name ending in
/// `Schedules`) or its leading comments say `schema version 4`; else 3 when it creates the
/// history table (a name ending in `History`) or its leading comments say `schema version
/// 3`; else 2 when it defines or adds the `Queue` column (a line starting with the column,
/// quoted the engine's way or not, after an optional `ADD [COLUMN]`) or its leading
/// comments say `schema version 2`; 1 otherwise (what icq wrote before queues). Either sign
/// is enough, so a file keeps its version through edits to its comments or its layout.
///
/// # Examples
///
/// ```
/// use icq::migrate::schema_version_of;
/// use icq::{Engine, TableName};
///
/// let table = TableName::default();
/// assert_eq!(schema_version_of(&icq::schema::render(Engine::Mysql, &table).up), 4);
/// assert_eq!(schema_version_of(&icq::schema::render_upgrade_v4(Engine::Postgres, &table).up), 4);
/// assert_eq!(schema_version_of(&icq::schema::render_upgrade(Engine::Postgres, &table).up), 2);
/// assert_eq!(schema_version_of(&icq::schema::render_upgrade_v3(Engine::Sqlite, &table).up), 3);
/// assert_eq!(schema_version_of(&icq::schema::render_v1(Engine::Postgres, &table).up), 1);
/// // A table named "Queue" is not a Queue column.
/// let named_queue = TableName::parse("Queue")?;
/// assert_eq!(schema_version_of(&icq::schema::render_v1(Engine::Sqlite, &named_queue).up), 1);
/// # Ok::<(), icq::Error>(())
/// ```
pub fn schema_version_of(sql: &str) -> u32 {
    // A `CREATE TABLE` of a name ending in `suffix` (`<table>History`, `<table>Schedules`).
    let creates = |suffix: &str| {
        sql.lines().any(|line| {
            let line = line.trim().to_ascii_lowercase();
            line.strip_prefix("create table ")
                .map(|rest| rest.trim_end_matches([' ', '(']))
                .is_some_and(|name| {
                    ['"', '`', ']']
                        .iter()
                        .any(|quote| name.ends_with(&format!("{suffix}{quote}")))
                })
        })
    };
    let says = |version: &str| {
        sql.lines()
            .map(str::trim)
            .take_while(|l| l.starts_with("--"))
            .any(|l| l.to_ascii_lowercase().contains(version))
    };
    if creates("schedules") || says("schema version 4") {
        return 4;
    }
    if creates("history") || says("schema version 3") {
        return 3;
    }
    let leading_comments = says("schema version 2");
    let queue_column = sql.lines().any(|line| {
        let line = line.trim().to_ascii_lowercase();
        let line = line
            .strip_prefix("add column ")
            .or_else(|| line.strip_prefix("add "))
            .unwrap_or(&line)
            .trim_start();
        ["\"queue\"", "`queue`", "[queue]", "queue"]
            .iter()
            .any(|name| {
                line.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with([' ', '\t']))
            })
    });
    if leading_comments || queue_column {
        2
    } else {
        1
    }
}

/// A migration file found in a directory, read the way sqlx resolves it.
///
/// # Examples
///
/// ```
/// # let tmp = tempfile::tempdir()?;
/// # let dir = tmp.path().join("migrations");
/// # let url = format!("sqlite://{}", tmp.path().join("shop.db").display());
/// # icq::migrate::add(&icq::migrate::AddOptions { engine: icq::Engine::Sqlite, table: Default::default(), dir: dir.clone(), kind: Some(icq::migrate::MigrationKind::Reversible), versioning: icq::migrate::Versioning::Sequential })?;
/// use icq::migrate::scan;
/// use sqlx::migrate::MigrationType;
///
/// // `dir` holds icq's reversible SQLite migration 0001; `url` names a SQLite file.
/// std::fs::write(dir.join("0002_create_orders.sql"), "CREATE TABLE orders (id INTEGER);")?;
/// let found = scan(&dir)?;
/// let (up, orders) = (&found[0], &found[2]);
/// assert_eq!((up.version, up.migration_type), (1, MigrationType::ReversibleUp));
/// assert!(up.icq.is_some()); // icq wrote it
/// assert_eq!((orders.version, orders.description.as_str()), (2, "create_orders"));
/// assert!(orders.icq.is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct ExistingMigration {
    /// The version prefix, as a number.
    pub version: i64,
    /// The description part of the file name, underscores kept.
    pub description: String,
    /// Simple, up or down, from the file name's suffix.
    pub migration_type: MigrationType,
    /// Where the file is.
    pub path: PathBuf,
    /// icq's header, when icq generated the file.
    pub icq: Option<IcqHeader>,
}

/// Lists the migrations in `dir` by sqlx's rules (`<integer>_<description>.sql`, other files
/// ignored), sorted by version. A directory that does not exist holds no migrations.
///
/// # Examples
///
/// ```
/// use icq::migrate::scan;
///
/// # let tmp = tempfile::tempdir()?;
/// let dir = tmp.path();
/// assert!(scan(&dir.join("missing"))?.is_empty());
/// std::fs::write(dir.join("20300101120000_seed.sql"), "")?;
/// std::fs::write(dir.join("README.md"), "not a migration")?;
/// let versions: Vec<i64> = scan(dir)?.iter().map(|m| m.version).collect();
/// assert_eq!(versions, [20300101120000]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn scan(dir: &Path) -> Result<Vec<ExistingMigration>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(Error::io(format!("reading {}", dir.display()))(err)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(Error::io(format!("reading {}", dir.display())))?;
        let path = entry.path();
        if !path.is_file() {
            continue;
        }
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some((prefix, rest)) = file_name.split_once('_') else {
            continue;
        };
        if !rest.ends_with(".sql") {
            continue;
        }
        let version: i64 = prefix.parse().map_err(|_| {
            Error::invalid(format!(
                "{}: `{file_name}` does not start with an integer version, so sqlx cannot \
                 resolve this directory; rename or move the file",
                dir.display()
            ))
        })?;
        let migration_type = MigrationType::from_filename(rest);
        let description = rest.trim_end_matches(migration_type.suffix()).to_owned();
        let icq = if [
            DESCRIPTION,
            UPGRADE_V2_DESCRIPTION,
            UPGRADE_V3_DESCRIPTION,
            UPGRADE_V4_DESCRIPTION,
        ]
        .contains(&description.as_str())
        {
            let text = fs::read_to_string(&path)
                .map_err(Error::io(format!("reading {}", path.display())))?;
            IcqHeader::parse(&text)
        } else {
            None
        };
        found.push(ExistingMigration {
            version,
            description,
            migration_type,
            path,
            icq,
        });
    }
    found.sort_by(|a, b| {
        (a.version, a.migration_type, &a.path).cmp(&(b.version, b.migration_type, &b.path))
    });
    Ok(found)
}

/// The version prefix for a new migration in a directory holding `existing`.
///
/// Follows sqlx-cli 0.9 (see the module docs), then bumps the result past the latest
/// existing version so it can neither collide nor sort before it. See [`Versioning`]'s
/// example for the choice itself.
///
/// # Examples
///
/// ```
/// use icq::migrate::{Versioning, next_version, scan};
///
/// # let tmp = tempfile::tempdir()?;
/// # let dir = tmp.path();
/// // A migration from the future: the next timestamp goes past it instead of before it.
/// std::fs::write(dir.join("20990101000000_later.sql"), "")?;
/// let now = "2030-01-01T12:00:00Z".parse()?;
/// assert_eq!(next_version(&scan(dir)?, Versioning::Timestamp, now), "20990101000001");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn next_version(
    existing: &[ExistingMigration],
    versioning: Versioning,
    now: DateTime<Utc>,
) -> String {
    let versions: Vec<i64> = existing
        .iter()
        .map(|m| m.version)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let latest = versions.last().copied();
    let sequential_next = match versioning {
        Versioning::Timestamp => None,
        Versioning::Sequential => Some(latest.map_or(1, |v| v.saturating_add(1))),
        Versioning::Inferred => match versions.as_slice() {
            [.., previous, latest] => (latest - previous == 1).then_some(latest + 1),
            [latest] => matches!(*latest, 0 | 1).then_some(latest + 1),
            [] => None,
        },
    };
    match sequential_next {
        Some(version) => format!("{version:04}"),
        None => {
            let stamp = now.format("%Y%m%d%H%M%S").to_string();
            match (stamp.parse::<i64>(), latest) {
                (Ok(candidate), Some(latest)) if candidate <= latest => {
                    latest.saturating_add(1).to_string()
                }
                _ => stamp,
            }
        }
    }
}

/// The kind sqlx-cli would pick when neither `--reversible` nor `--simple` is given:
/// reversible when the directory's last migration is.
///
/// # Examples
///
/// ```
/// use icq::migrate::{MigrationKind, infer_kind, scan};
///
/// # let tmp = tempfile::tempdir()?;
/// # let dir = tmp.path();
/// assert_eq!(infer_kind(&[]), MigrationKind::Simple);
/// std::fs::write(dir.join("0001_orders.up.sql"), "")?;
/// std::fs::write(dir.join("0001_orders.down.sql"), "")?;
/// assert_eq!(infer_kind(&scan(dir)?), MigrationKind::Reversible);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn infer_kind(existing: &[ExistingMigration]) -> MigrationKind {
    match existing.last() {
        Some(last) if last.migration_type.is_reversible() => MigrationKind::Reversible,
        _ => MigrationKind::Simple,
    }
}

/// The full text of one generated file: icq's header line, then the engine's DDL (the
/// `up` or `down` of [`crate::schema::render`], by `migration_type`).
///
/// # Examples
///
/// ```
/// use icq::migrate::file_sql;
/// use icq::{Engine, TableName};
/// use sqlx::migrate::MigrationType;
///
/// let down = file_sql(Engine::Sqlite, &TableName::default(), MigrationType::ReversibleDown);
/// assert!(down.starts_with("-- icq migration: engine=sqlite table=InternalCommands\n"));
/// assert!(down.contains("DROP TABLE"));
/// ```
pub fn file_sql(engine: Engine, table: &TableName, migration_type: MigrationType) -> String {
    let ddl = crate::schema::render(engine, table);
    let body = if migration_type.is_down_migration() {
        ddl.down
    } else {
        ddl.up
    };
    IcqHeader::line(engine, table) + &body
}

/// The full text of one file of the upgrade from version 1 to the current version: icq's
/// header line, then the `up` or `down` of [`crate::schema::render_upgrade_from`], by
/// `migration_type` ([`upgrade_file_sql_from`] upgrades from another version).
///
/// # Examples
///
/// ```
/// use icq::migrate::{schema_version_of, upgrade_file_sql};
/// use icq::{Engine, TableName};
/// use sqlx::migrate::MigrationType;
///
/// let up = upgrade_file_sql(Engine::Postgres, &TableName::default(), MigrationType::Simple);
/// assert!(up.starts_with("-- icq migration: engine=postgres table=InternalCommands\n"));
/// assert!(up.contains(r#"ADD COLUMN "Queue""#));
/// assert_eq!(schema_version_of(&up), 4);
/// ```
pub fn upgrade_file_sql(
    engine: Engine,
    table: &TableName,
    migration_type: MigrationType,
) -> String {
    upgrade_file_sql_from(engine, table, 1, migration_type)
}

/// [`upgrade_file_sql`] from schema version `from` (1, 2 or 3).
pub fn upgrade_file_sql_from(
    engine: Engine,
    table: &TableName,
    from: u32,
    migration_type: MigrationType,
) -> String {
    let ddl = crate::schema::render_upgrade_from(engine, table, from);
    let body = if migration_type.is_down_migration() {
        ddl.down
    } else {
        ddl.up
    };
    IcqHeader::line(engine, table) + &body
}

/// What `icq migrate add` was asked for.
///
/// # Examples
///
/// ```
/// # let tmp = tempfile::tempdir()?;
/// use icq::migrate::{AddOptions, Versioning, add};
/// use icq::{Engine, TableName};
///
/// // `icq migrate add --engine postgres --table jobs.Commands --dir db/migrations --sequential`
/// let opts = AddOptions {
///     engine: Engine::Postgres,
///     table: TableName::parse("jobs.Commands")?,
///     dir: tmp.path().join("db/migrations"),
///     kind: None, // like the directory's last migration: simple in an empty one
///     versioning: Versioning::Sequential,
/// };
/// let written = add(&opts)?;
/// assert_eq!(written.version, "0001");
/// assert!(written.files[0].sql.contains(r#"CREATE TABLE "jobs"."Commands""#));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct AddOptions {
    /// The engine to write SQL for.
    pub engine: Engine,
    /// The table to create (or upgrade).
    pub table: TableName,
    /// The migrations directory (see [`default_dir`]).
    pub dir: PathBuf,
    /// Simple or reversible; `None` infers it from the directory like sqlx-cli.
    pub kind: Option<MigrationKind>,
    /// How to choose the version.
    pub versioning: Versioning,
}

/// One file a [`MigrationPlan`] will write.
///
/// # Examples
///
/// ```
/// # let tmp = tempfile::tempdir()?;
/// use icq::migrate::{AddOptions, MigrationKind, Versioning, plan};
/// use icq::{Engine, TableName};
///
/// let opts = AddOptions {
///     engine: Engine::Sqlite,
///     table: TableName::default(),
///     dir: tmp.path().join("migrations"),
///     kind: Some(MigrationKind::Reversible),
///     versioning: Versioning::Inferred,
/// };
/// for file in plan(&opts, chrono::Utc::now())?.files {
///     println!("{} ({:?}, {} bytes)", file.path.display(), file.migration_type, file.sql.len());
///     assert!(!file.path.exists()); // planned, not written
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct PlannedFile {
    /// Where it goes.
    pub path: PathBuf,
    /// Simple, up or down.
    pub migration_type: MigrationType,
    /// Its full contents.
    pub sql: String,
}

/// What `icq migrate add` does for a table, given what its directory already holds.
///
/// See [`UPGRADE_V2_DESCRIPTION`]'s example for all three.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanAction {
    /// No icq migration for the table yet: write the whole table (schema version 4) as
    /// `<version>_add_internal_commands.sql`.
    Create,
    /// The directory brings the table to an older schema version: write the upgrade to
    /// the current one as `<version>_icq_schema_v4.sql`.
    Upgrade {
        /// The newest icq migration found.
        from: PathBuf,
        /// The schema version it leaves the table at.
        version: u32,
    },
    /// The directory already brings the table to the current schema version: nothing to
    /// write.
    UpToDate {
        /// The migration that does.
        by: PathBuf,
    },
}

/// The files `icq migrate add` would write, before anything touches the disk.
///
/// # Examples
///
/// ```
/// # let tmp = tempfile::tempdir()?;
/// use icq::migrate::{AddOptions, MigrationKind, Versioning, plan};
/// use icq::{Engine, TableName};
///
/// let opts = AddOptions {
///     engine: Engine::Sqlite,
///     table: TableName::default(),
///     dir: tmp.path().join("migrations"),
///     kind: None,
///     versioning: Versioning::Inferred,
/// };
/// let plan = plan(&opts, "2030-01-01T12:00:00Z".parse()?)?; // `icq migrate add --dry-run`
/// assert_eq!((plan.version.as_str(), plan.kind), ("20300101120000", MigrationKind::Simple));
/// assert_eq!(plan.files.len(), 1);
/// let written = plan.write()?;
/// assert!(written[0].exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct MigrationPlan {
    /// The engine the SQL is for.
    pub engine: Engine,
    /// The table it creates or upgrades.
    pub table: TableName,
    /// The directory the files go to.
    pub dir: PathBuf,
    /// Create, upgrade, or nothing at all.
    pub action: PlanAction,
    /// The version prefix, as it appears in the file names (the one the files would have
    /// when there are none to write).
    pub version: String,
    /// Simple or reversible.
    pub kind: MigrationKind,
    /// One file, or the up and down pair; none when the directory is up to date.
    pub files: Vec<PlannedFile>,
    existing: Vec<ExistingMigration>,
}

/// Works out the version, kind and contents of the migration `opts` asks for, reading (but
/// not changing) the directory. `now` is the clock for timestamp versions. Apply it with
/// [`MigrationPlan::write`].
///
/// # Examples
///
/// ```
/// # let tmp = tempfile::tempdir()?;
/// use icq::migrate::{AddOptions, Versioning, plan};
/// use icq::{Engine, TableName};
///
/// let opts = AddOptions {
///     engine: Engine::Sqlite,
///     table: TableName::default(),
///     dir: tmp.path().join("migrations"),
///     kind: None,
///     versioning: Versioning::Inferred,
/// };
/// let first = plan(&opts, "2030-01-01T12:00:00Z".parse()?)?;
/// first.write()?;
/// let again = plan(&opts, "2030-01-01T12:00:00Z".parse()?)?; // within the same second
/// assert_eq!(again.version, "20300101120001"); // bumped, never the same version
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn plan(opts: &AddOptions, now: DateTime<Utc>) -> Result<MigrationPlan> {
    let existing = scan(&opts.dir)?;
    let version = next_version(&existing, opts.versioning, now);
    let kind = opts.kind.unwrap_or_else(|| infer_kind(&existing));
    let action = match table_migrations(&existing, opts.engine, &opts.table)
        .max_by_key(|m| (m.icq.as_ref().map_or(0, |h| h.schema), m.version))
    {
        None => PlanAction::Create,
        Some(m) if m.icq.as_ref().is_some_and(|h| h.schema >= SCHEMA_VERSION) => {
            PlanAction::UpToDate { by: m.path.clone() }
        }
        Some(m) => PlanAction::Upgrade {
            from: m.path.clone(),
            version: m.icq.as_ref().map_or(1, |h| h.schema),
        },
    };
    let description = match action {
        PlanAction::Upgrade { .. } => UPGRADE_V4_DESCRIPTION,
        _ => DESCRIPTION,
    };
    let files = match action {
        PlanAction::UpToDate { .. } => Vec::new(),
        _ => kind
            .file_types()
            .iter()
            .map(|&migration_type| PlannedFile {
                path: opts.dir.join(format!(
                    "{version}_{description}{}",
                    migration_type.suffix()
                )),
                migration_type,
                sql: match action {
                    PlanAction::Upgrade { version, .. } => {
                        upgrade_file_sql_from(opts.engine, &opts.table, version, migration_type)
                    }
                    _ => file_sql(opts.engine, &opts.table, migration_type),
                },
            })
            .collect(),
    };
    Ok(MigrationPlan {
        engine: opts.engine,
        table: opts.table.clone(),
        dir: opts.dir.clone(),
        action,
        version,
        kind,
        files,
        existing,
    })
}

/// icq's up (or simple) migrations in `existing` for `table` on `engine`. PostgreSQL's
/// quoted names are case-sensitive; SQLite's are not, nor are MySQL's and SQL Server's with
/// their usual settings.
fn table_migrations<'a>(
    existing: &'a [ExistingMigration],
    engine: Engine,
    table: &TableName,
) -> impl Iterator<Item = &'a ExistingMigration> {
    let table = table.to_string();
    existing.iter().filter(move |m| {
        !m.migration_type.is_down_migration()
            && m.icq.as_ref().is_some_and(|h| {
                h.engine == engine
                    && match engine {
                        Engine::Postgres => h.table == table,
                        _ => h.table.eq_ignore_ascii_case(&table),
                    }
            })
    })
}

/// Plans and writes the migration `opts` asks for, versioned from the current time. See
/// [`AddOptions`]'s example; the [module docs](self) show `add` then [`run`].
pub fn add(opts: &AddOptions) -> Result<MigrationPlan> {
    let plan = plan(opts, Utc::now())?;
    plan.write()?;
    Ok(plan)
}

impl MigrationPlan {
    /// Fails when the directory already holds icq's migration for another engine.
    ///
    /// # Examples
    ///
    /// ```
    /// # let tmp = tempfile::tempdir()?;
    /// use icq::migrate::{AddOptions, Versioning, add, plan};
    /// use icq::{Engine, TableName};
    ///
    /// let opts = AddOptions {
    ///     engine: Engine::Postgres,
    ///     table: TableName::default(),
    ///     dir: tmp.path().join("migrations"),
    ///     kind: None,
    ///     versioning: Versioning::Inferred,
    /// };
    /// add(&opts)?;
    /// let sqlite = AddOptions { engine: Engine::Sqlite, ..opts.clone() };
    /// let mixed = plan(&sqlite, chrono::Utc::now())?;
    /// let err = mixed.check_engines().unwrap_err();
    /// assert!(err.to_string().contains("already holds icq's postgres migration"), "{err}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_engines(&self) -> Result<()> {
        let foreign = self
            .existing
            .iter()
            .find(|m| m.icq.as_ref().is_some_and(|h| h.engine != self.engine));
        match foreign {
            Some(m) => Err(Error::Refused(format!(
                "{} already holds icq's {} migration ({}); a {} migration cannot go in the \
                 same directory, since sqlx runs every file in it against one database; \
                 pass --dir {}",
                self.dir.display(),
                m.icq.as_ref().map_or("other", |h| h.engine.name()),
                m.path.display(),
                self.engine,
                Path::new(DEFAULT_DIR).join(self.engine.name()).display(),
            ))),
            None => Ok(()),
        }
    }

    /// Fails when the directory already holds what this plan would write: a migration
    /// creating the table for a [`PlanAction::Create`] plan, one bringing it to schema
    /// version 2 for an [`PlanAction::Upgrade`]. [`plan`] never makes such a plan (it
    /// upgrades, or finds the directory up to date); [`Self::write`] checks again anyway.
    ///
    /// # Examples
    ///
    /// ```
    /// # let tmp = tempfile::tempdir()?;
    /// use icq::migrate::{AddOptions, PlanAction, Versioning, add, plan};
    /// use icq::{Engine, TableName};
    ///
    /// let opts = AddOptions {
    ///     engine: Engine::Sqlite,
    ///     table: TableName::default(),
    ///     dir: tmp.path().join("migrations"),
    ///     kind: None,
    ///     versioning: Versioning::Inferred,
    /// };
    /// add(&opts)?;
    /// let again = plan(&opts, chrono::Utc::now())?;
    /// assert!(matches!(again.action, PlanAction::UpToDate { .. }));
    /// again.check_same_table()?; // nothing to write, nothing twice
    /// let billing = TableName::parse("BillingCommands")?;
    /// let second_queue = AddOptions { table: billing, ..opts.clone() };
    /// let other = plan(&second_queue, chrono::Utc::now())?;
    /// assert_eq!(other.action, PlanAction::Create);
    /// other.check_same_table()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_same_table(&self) -> Result<()> {
        let table = self.table.to_string();
        let mut earlier = table_migrations(&self.existing, self.engine, &self.table);
        let clash = match self.action {
            PlanAction::Create => earlier.next(),
            PlanAction::Upgrade { .. } => {
                earlier.find(|m| m.icq.as_ref().is_some_and(|h| h.schema >= SCHEMA_VERSION))
            }
            PlanAction::UpToDate { .. } => None,
        };
        match clash {
            Some(m) => Err(Error::Refused(format!(
                "{} already creates {table}; a second migration for it would fail when run. \
                 Pass --table NAME for another queue table, or --dir for another directory",
                m.path.display()
            ))),
            None => Ok(()),
        }
    }

    /// Writes the files, creating the directory if needed. Refuses to mix engines
    /// ([`Self::check_engines`]) or to create a table twice ([`Self::check_same_table`]),
    /// and never overwrites: if any file already exists nothing is left behind.
    ///
    /// # Examples
    ///
    /// ```
    /// # let tmp = tempfile::tempdir()?;
    /// use icq::migrate::{AddOptions, MigrationKind, Versioning, plan};
    /// use icq::{Engine, TableName};
    ///
    /// let opts = AddOptions {
    ///     engine: Engine::Sqlite,
    ///     table: TableName::default(),
    ///     dir: tmp.path().join("migrations"),
    ///     kind: Some(MigrationKind::Reversible),
    ///     versioning: Versioning::Inferred,
    /// };
    /// let plan = plan(&opts, chrono::Utc::now())?;
    /// std::fs::create_dir_all(&opts.dir)?;
    /// std::fs::write(&plan.files[1].path, "-- someone else's file")?; // the .down.sql is taken
    /// assert!(plan.write().is_err());
    /// assert!(!plan.files[0].path.exists()); // the .up.sql was removed again
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write(&self) -> Result<Vec<PathBuf>> {
        self.check_engines()?;
        self.check_same_table()?;
        if self.files.is_empty() {
            return Ok(Vec::new());
        }
        fs::create_dir_all(&self.dir)
            .map_err(Error::io(format!("creating {}", self.dir.display())))?;
        let mut written: Vec<PathBuf> = Vec::new();
        for file in &self.files {
            if let Err(err) = write_new(&file.path, &file.sql) {
                for path in &written {
                    let _ = fs::remove_file(path);
                }
                return Err(err);
            }
            written.push(file.path.clone());
        }
        Ok(written)
    }
}

fn write_new(path: &Path, sql: &str) -> Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|err| match err.kind() {
            std::io::ErrorKind::AlreadyExists => Error::Refused(format!(
                "{} already exists; icq never overwrites a migration (run the command again \
                 for a fresh version)",
                path.display()
            )),
            _ => Error::io(format!("creating {}", path.display()))(err),
        })?;
    file.write_all(sql.as_bytes())
        .map_err(Error::io(format!("writing {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(stamp: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(stamp)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn existing(names: &[&str]) -> Vec<ExistingMigration> {
        let dir = tempfile::tempdir().unwrap();
        for name in names {
            fs::write(dir.path().join(name), "-- x\n").unwrap();
        }
        scan(dir.path()).unwrap()
    }

    const NOW: &str = "2026-01-31T12:34:56Z";

    #[test]
    fn versions_follow_sqlx_cli() {
        let now = at(NOW);
        let v = |names: &[&str], versioning| next_version(&existing(names), versioning, now);
        assert_eq!(v(&[], Versioning::Inferred), "20260131123456");
        assert_eq!(v(&["0001_a.sql"], Versioning::Inferred), "0002");
        assert_eq!(v(&["0000_a.sql"], Versioning::Inferred), "0001");
        assert_eq!(v(&["0002_a.sql"], Versioning::Inferred), "20260131123456");
        assert_eq!(
            v(&["0001_a.sql", "0002_b.sql"], Versioning::Inferred),
            "0003"
        );
        assert_eq!(
            v(&["0001_a.sql", "0003_b.sql"], Versioning::Inferred),
            "20260131123456"
        );
        assert_eq!(
            v(&["0001_a.up.sql", "0001_a.down.sql"], Versioning::Inferred),
            "0002"
        );
        assert_eq!(v(&["0001_a.sql"], Versioning::Timestamp), "20260131123456");
        assert_eq!(v(&[], Versioning::Sequential), "0001");
        assert_eq!(
            v(&["20250101000000_a.sql"], Versioning::Sequential),
            "20250101000001"
        );
        assert_eq!(
            v(&["20250101000000_a.sql"], Versioning::Inferred),
            "20260131123456"
        );
    }

    #[test]
    fn versions_never_collide() {
        let now = at(NOW);
        let same = existing(&["20260131123456_add_internal_commands.sql"]);
        assert_eq!(
            next_version(&same, Versioning::Inferred, now),
            "20260131123457"
        );
        let later = existing(&["20270101000000_x.up.sql", "20270101000000_x.down.sql"]);
        assert_eq!(
            next_version(&later, Versioning::Timestamp, now),
            "20270101000001"
        );
    }

    #[test]
    fn kind_follows_the_last_migration() {
        assert_eq!(infer_kind(&existing(&[])), MigrationKind::Simple);
        assert_eq!(
            infer_kind(&existing(&["1_a.up.sql", "1_a.down.sql"])),
            MigrationKind::Reversible
        );
        assert_eq!(
            infer_kind(&existing(&["1_a.up.sql", "1_a.down.sql", "2_b.sql"])),
            MigrationKind::Simple
        );
    }

    #[test]
    fn header_round_trips() {
        let table = TableName::parse("jobs.Queue").unwrap();
        for engine in Engine::ALL {
            let sql = file_sql(engine, &table, MigrationType::ReversibleDown);
            let header = IcqHeader::parse(&sql).unwrap();
            assert_eq!(header.engine, engine);
            assert_eq!(header.table, "jobs.Queue");
            assert!(!sql.starts_with("-- no-transaction"));
        }
        assert_eq!(IcqHeader::parse("-- Add migration script here\n"), None);
    }

    #[test]
    fn scan_rejects_what_sqlx_rejects_and_skips_what_it_skips() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("README.md"), "").unwrap();
        fs::write(dir.path().join("notes.sql"), "").unwrap();
        fs::create_dir(dir.path().join("sqlserver")).unwrap();
        assert!(scan(dir.path()).unwrap().is_empty());
        fs::write(dir.path().join("v1_x.sql"), "").unwrap();
        assert!(matches!(scan(dir.path()), Err(Error::Invalid { .. })));
    }
}
