//! `icq migrate add` and `icq migrate run`: the clap layer over [`crate::migrate`].
//!
//! `add` writes (or with `--stdout` prints) the migration that creates the commands table,
//! named and versioned the way sqlx-cli would; `run` applies a migrations directory with
//! sqlx's migrator. Both print what they did; neither ever prints a database password.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use super::{Format, GlobalArgs};
use crate::error::Error;
use crate::ident::{Engine, TableName};
use crate::migrate::{self, AddOptions, MigrationKind, Versioning};
use crate::output;
use crate::redact::redact_url;

/// Migration subcommands.
#[derive(Debug, Subcommand)]
pub enum MigrateCommand {
    /// Write the migration that creates the commands table, named like sqlx-cli's.
    ///
    /// The file is `<version>_add_internal_commands.sql` (or an `.up.sql` + `.down.sql`
    /// pair), versioned like `sqlx migrate add`: a UTC timestamp, or the next number when
    /// the directory is already sequential. Existing files are never overwritten.
    Add(AddArgs),
    /// Apply pending migrations with sqlx's migrator (same bookkeeping as `sqlx migrate run`).
    Run(RunArgs),
}

/// Arguments of `icq migrate add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    /// SQL dialect to write: postgres, sqlite, mysql or sqlserver [default: from the
    /// --database-url / $DATABASE_URL scheme].
    #[arg(long, value_name = "ENGINE", value_parser = parse_engine)]
    pub engine: Option<Engine>,

    /// Table to create, optionally schema-qualified [default: InternalCommands].
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

/// Arguments of `icq migrate run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Migrations directory to apply.
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
pub async fn run(cmd: MigrateCommand, global: &super::GlobalArgs) -> anyhow::Result<()> {
    match cmd {
        MigrateCommand::Add(args) => add(args, global),
        MigrateCommand::Run(args) => apply(args, global).await,
    }
}

fn add(args: AddArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let engine = match args.engine {
        Some(engine) => engine,
        None => match resolve_url(global)? {
            Some(url) => Engine::from_url(&url)?,
            None => {
                return Err(Error::Usage(
                    "which engine? pass --engine <postgres|sqlite|mysql|sqlserver>, or \
                     --database-url / $DATABASE_URL to take it from the URL"
                        .into(),
                )
                .into());
            }
        },
    };
    let table = match args.table {
        Some(table) => table,
        None => source_table(global)?.unwrap_or_default(),
    };
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

    for earlier in plan.same_table() {
        output::note(&format!(
            "warning: {} already creates {}; running both will fail",
            earlier.display(),
            plan.table
        ));
    }
    let written = plan.write()?;
    match global.format {
        Format::Table => {
            let mut text = String::new();
            for path in &written {
                text.push_str(&format!("{}\n", path.display()));
            }
            output::raw(&text)?;
        }
        Format::Json => {
            let doc = serde_json::json!({
                "engine": plan.engine,
                "version": plan.version,
                "kind": plan.kind,
                "files": written.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            });
            output::raw(&format!("{doc}\n"))?;
        }
    }
    Ok(())
}

async fn apply(args: RunArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let url = resolve_url(global)?.ok_or_else(|| {
        Error::Usage("no database to migrate: pass --database-url URL or set $DATABASE_URL".into())
    })?;
    let shown = redact_url(&url);
    let report = migrate::run(&url, &args.dir)
        .await
        .with_context(|| format!("migrating {shown} from {}", args.dir.display()))?;
    match global.format {
        Format::Table => {
            let mut text = String::new();
            for applied in &report.applied {
                text.push_str(&format!(
                    "applied {}/{}\n",
                    applied.version, applied.description
                ));
            }
            if report.applied.is_empty() {
                let n = report.already_applied;
                let noun = if n == 1 { "migration" } else { "migrations" };
                text.push_str(&format!(
                    "{shown} is up to date ({n} {noun} already applied)\n"
                ));
            }
            output::raw(&text)?;
        }
        Format::Json => {
            let doc = serde_json::json!({
                "database": shown,
                "applied": report.applied,
                "already_applied": report.already_applied,
            });
            output::raw(&format!("{doc}\n"))?;
        }
    }
    Ok(())
}

// ---- Configuration hooks ------------------------------------------------------------------
/// The configured source `migrate` works on, if the command line or configuration names
/// one: `--source`, or the only source of the configuration file, or `$DATABASE_URL`.
/// The embedded default does not count: migrations for it are never implied.
fn selected_source(global: &GlobalArgs) -> anyhow::Result<Option<crate::config::SourceConfig>> {
    if global.database_url.is_some() && global.source.is_none() {
        return Ok(None);
    }
    let config = crate::sources::load_config(&global.source_request())?;
    let selected = config.select(global.source.as_deref())?;
    match selected.as_slice() {
        [one] if one.embedded => Ok(None),
        [one] => Ok(Some((*one).clone())),
        many => {
            let names: Vec<&str> = many.iter().map(|s| s.name.as_str()).collect();
            Err(Error::Usage(format!(
                "{} sources are configured ({}); choose one with --source",
                many.len(),
                names.join(", ")
            ))
            .into())
        }
    }
}

/// The database URL `migrate` works on: `--database-url`, else the selected source's.
fn resolve_url(global: &GlobalArgs) -> anyhow::Result<Option<String>> {
    if let Some(url) = &global.database_url {
        return Ok(Some(url.clone()));
    }
    Ok(selected_source(global)?.map(|source| source.url.expose().to_owned()))
}

/// The table the selected configured source uses (`table:` in icq.yaml), if any.
fn source_table(global: &GlobalArgs) -> anyhow::Result<Option<TableName>> {
    Ok(selected_source(global)?.map(|source| source.table))
}
