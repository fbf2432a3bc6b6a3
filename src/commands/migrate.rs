//! `icq migrate add|run|revert|info`: the clap layer over [`icq::migrate`].
//!
//! `add` writes (or with `--stdout` prints) the migration that creates the commands table,
//! named and versioned the way sqlx-cli would; `run`, `revert` and `info` work on a
//! database with sqlx's bookkeeping and print sqlx-cli's line shapes. The database comes
//! from [`crate::cli::sources::migration_target`]; no command ever prints a database password.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use super::{GlobalArgs, man};
use crate::cli::error::CliError;
use crate::cli::output::{self, Format, migrate::Added};
use crate::cli::sources::{MigrationTarget, migration_target};
use icq::error::Error;
use icq::ident::{Engine, TableName};
use icq::migrate::{self, AddOptions, MigrateOptions, MigrationKind, PlanAction, Versioning};
use icq::redact::redact_url;

/// Migration subcommands.
#[derive(Debug, Subcommand)]
pub enum MigrateCommand {
    /// Write the migration that creates (or upgrades) the commands table, named like sqlx-cli's.
    ///
    /// The file is `<version>_add_internal_commands.sql` (or an `.up.sql` + `.down.sql`
    /// pair), versioned like `sqlx migrate add`: a UTC timestamp, or the next number when
    /// the directory is already sequential. A directory whose migration creates the table
    /// at schema version 1 (an older icq) gets the upgrade `<version>_icq_schema_v2.sql`
    /// instead; one that already has version 2 is up to date and nothing is written.
    /// Existing files are never overwritten.
    #[command(after_help = man::MIGRATE_ADD)]
    Add(AddArgs),
    /// Apply pending migrations with sqlx's migrator (same bookkeeping as `sqlx migrate run`).
    #[command(after_help = man::MIGRATE_RUN)]
    Run(ApplyArgs),
    /// Undo the latest applied migration with its `.down.sql` (`sqlx migrate revert`).
    #[command(after_help = man::MIGRATE_REVERT)]
    Revert(ApplyArgs),
    /// List the directory's migrations and whether each is applied (`sqlx migrate info`).
    #[command(after_help = man::MIGRATE_INFO)]
    Info(InfoArgs),
}

/// Arguments of `icq migrate add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    /// SQL dialect to write: postgres, sqlite, mysql or sqlserver [default: from the
    /// --database-url / $DATABASE_URL scheme].
    #[arg(long, value_name = "ENGINE", value_parser = parse_engine)]
    pub engine: Option<Engine>,

    /// Table to create or upgrade, optionally schema-qualified [default: InternalCommands].
    #[arg(long, value_name = "NAME", value_parser = parse_table)]
    pub table: Option<TableName>,

    /// Migrations directory [default: migrations, or migrations/sqlserver for SQL Server].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Write an up/down pair that `sqlx migrate revert` can undo.
    #[arg(short, long, conflicts_with = "simple")]
    pub reversible: bool,

    /// Write a single up-only file [default unless the directory's last migration is
    /// reversible].
    #[arg(long)]
    pub simple: bool,

    /// Version with a `YYYYMMDDHHMMSS` UTC timestamp, even in a sequential directory.
    #[arg(short, long, conflicts_with = "sequential")]
    pub timestamp: bool,

    /// Version with the next number (`0001`-style), even in a timestamped directory.
    #[arg(short, long)]
    pub sequential: bool,

    /// Print the SQL instead of writing files.
    #[arg(long)]
    pub stdout: bool,
}

/// Arguments of `icq migrate run` and `icq migrate revert`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Migrations directory.
    #[arg(long, value_name = "DIR", default_value = migrate::DEFAULT_DIR)]
    pub dir: PathBuf,

    /// Print what would be applied (or reverted) and change nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// run: apply up to and including this version. revert: undo every migration above
    /// it (0 undoes all).
    #[arg(long, value_name = "VERSION", value_parser = crate::cli::parse::parse_target_version)]
    pub target_version: Option<i64>,
}

/// Arguments of `icq migrate info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Migrations directory.
    #[arg(long, value_name = "DIR", default_value = migrate::DEFAULT_DIR)]
    pub dir: PathBuf,
}

fn parse_engine(raw: &str) -> Result<Engine, Error> {
    raw.parse()
}

fn parse_table(raw: &str) -> Result<TableName, Error> {
    raw.parse()
}

/// Runs a migrate subcommand.
pub async fn run(cmd: MigrateCommand, global: &GlobalArgs) -> anyhow::Result<()> {
    match cmd {
        MigrateCommand::Add(args) => add(args, global),
        MigrateCommand::Run(args) => {
            let (url, dir) = (database(global)?, args.dir.clone());
            let report = migrate::run(&url, &dir, &options(&args))
                .await
                .with_context(|| {
                    format!("migrating {} from {}", redact_url(&url), dir.display())
                })?;
            Ok(output::emit(global.format, &report)?)
        }
        MigrateCommand::Revert(args) => {
            let (url, dir) = (database(global)?, args.dir.clone());
            let report = migrate::revert(&url, &dir, &options(&args))
                .await
                .with_context(|| {
                    format!("reverting {} with {}", redact_url(&url), dir.display())
                })?;
            Ok(output::emit(global.format, &report)?)
        }
        MigrateCommand::Info(args) => {
            let url = database(global)?;
            let report = migrate::info(&url, &args.dir)
                .await
                .with_context(|| format!("reading {}'s migrations", redact_url(&url)))?;
            Ok(output::emit(global.format, &report)?)
        }
    }
}

fn options(args: &ApplyArgs) -> MigrateOptions {
    MigrateOptions {
        dry_run: args.dry_run,
        target_version: args.target_version,
    }
}

/// The database URL to work on; none configured is a usage error.
fn database(global: &GlobalArgs) -> anyhow::Result<String> {
    match migration_target(&global.source_request())? {
        Some(MigrationTarget { url, .. }) => Ok(url),
        None => Err(CliError::Usage(
            "no database to migrate: pass --database-url URL, set $DATABASE_URL, or \
             configure a source (--source NAME when there are several)"
                .into(),
        )
        .into()),
    }
}

fn add(args: AddArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    // Only what the flags leave open is looked up (an explicit --engine and --table need
    // no configuration at all).
    let target = if args.engine.is_none() || args.table.is_none() {
        migration_target(&global.source_request())?
    } else {
        None
    };
    let engine = match (args.engine, &target) {
        (Some(engine), _) => engine,
        (None, Some(target)) => Engine::from_url(&target.url)?,
        (None, None) => {
            return Err(CliError::Usage(
                "which engine? pass --engine <postgres|sqlite|mysql|sqlserver>, or \
                 --database-url / $DATABASE_URL to take it from the URL"
                    .into(),
            )
            .into());
        }
    };
    let table = args
        .table
        .or_else(|| target.and_then(|t| t.table))
        .unwrap_or_default();
    let opts = AddOptions {
        engine,
        table,
        dir: args.dir.unwrap_or_else(|| migrate::default_dir(engine)),
        kind: if args.reversible {
            Some(MigrationKind::Reversible)
        } else if args.simple {
            Some(MigrationKind::Simple)
        } else {
            None
        },
        versioning: if args.timestamp {
            Versioning::Timestamp
        } else if args.sequential {
            Versioning::Sequential
        } else {
            Versioning::Inferred
        },
    };
    let plan = migrate::plan(&opts, chrono::Utc::now())?;

    if let PlanAction::UpToDate { by } = &plan.action {
        let up_to_date = Added::up_to_date(&plan, by.clone());
        if args.stdout {
            // stdout carries SQL only, and there is none to print.
            output::note(up_to_date.message().trim_end());
            return Ok(());
        }
        return Ok(output::emit(global.format, &up_to_date)?);
    }

    if args.stdout {
        let several = plan.files.len() > 1;
        let mut text = String::new();
        for file in &plan.files {
            if several {
                let name = file.path.file_name().unwrap_or_default();
                text.push_str(&format!("-- ==> {}\n", name.to_string_lossy()));
            }
            text.push_str(&file.sql);
        }
        output::raw(&text)?;
        return Ok(());
    }

    let files = plan.write()?;
    let added = Added::written(&plan, files);
    if let (PlanAction::Upgrade { from, version }, Format::Table) = (&plan.action, global.format) {
        let apply = match plan.engine {
            Engine::SqlServer => "with `sqlcmd -b -I`, DbUp or Flyway",
            _ => "with `icq migrate run` (or `sqlx migrate run`)",
        };
        output::note(&format!(
            "{} leaves {} at schema version {version}; the new migration upgrades it to \
             version {} (every row kept; completed commands move to {}). Apply it {apply}, \
             then restart the workers",
            from.display(),
            plan.table,
            icq::schema::SCHEMA_VERSION,
            plan.table.history()
        ));
    }
    Ok(output::emit(global.format, &added)?)
}
