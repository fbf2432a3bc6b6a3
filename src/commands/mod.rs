//! The command line: clap definitions and dispatch. Each subcommand lives in its own file
//! as a thin layer: parse arguments, call the library, render the result.

pub mod bench;
pub mod cancel;
pub mod completions;
pub mod config;
pub mod console;
pub mod dead_letters;
pub mod doctor;
pub mod exec_watchdog;
pub mod list;
pub mod man;
pub mod migrate;
pub mod pending;
pub mod progress;
pub mod purge;
pub mod queue;
pub mod quickstart;
pub mod replay;
pub mod requeue;
pub mod schedule;
pub mod schedules;
pub mod show;
pub mod work;

use std::path::PathBuf;

use crate::cli::error::CliError;
use clap::{Args, Parser, Subcommand};

/// A durable job queue that lives inside your application's own database.
#[derive(Debug, Parser)]
#[command(
    name = "icq",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_help = man::EXIT_CODES
)]
pub struct Cli {
    /// Options shared by every subcommand.
    #[command(flatten)]
    pub global: GlobalArgs,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every subcommand accepts.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global options")]
pub struct GlobalArgs {
    /// Configuration file (default: $ICQ_CONFIG, ./icq.yaml, then the user config dir).
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Only this configured source (default: every source, or the only one).
    #[arg(long, global = true, value_name = "NAME")]
    pub source: Option<String>,

    /// Database URL, instead of a configuration file (also $DATABASE_URL).
    #[arg(long, global = true, value_name = "URL")]
    pub database_url: Option<String>,

    /// Output format: tables for people (tab-separated lines with a header when stdout is
    /// not a terminal, unless `--format table` is given), or one JSON document for scripts.
    #[arg(long, global = true, value_enum, default_value_t = Format::Table)]
    pub format: Format,

    /// Whether `--format` was given explicitly (set by [`Cli::try_parse_args`]): tables
    /// are drawn in a pipe only when asked for, otherwise a pipe gets tab-separated lines.
    #[arg(skip)]
    pub format_given: bool,
}

pub use crate::cli::output::{Format, note};
pub use icq::redact::redact_text;

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write or apply the migration that creates the commands table.
    #[command(subcommand)]
    Migrate(migrate::MigrateCommand),

    /// A guided tour on the given database (default: the embedded SQLite one), in its own
    /// table: schedule samples, work, inspect.
    #[command(after_help = man::QUICKSTART)]
    Quickstart(quickstart::QuickstartArgs),

    /// Run the processor for every configured source in the foreground.
    #[command(after_help = man::WORK)]
    Work(work::WorkArgs),

    /// Count commands per state: due, scheduled, running, dead, completed.
    #[command(after_help = man::PENDING)]
    Pending(pending::PendingArgs),

    /// List one page of commands in a state (pending, due, scheduled, running, dead,
    /// completed), with the id that starts the next page.
    #[command(after_help = man::LIST)]
    List(list::ListArgs),

    /// Show one command in full, in any state.
    #[command(after_help = man::SHOW)]
    Show(show::ShowArgs),

    /// Take pending commands out of the queue without running them.
    #[command(after_help = man::CANCEL)]
    Cancel(cancel::CancelArgs),

    /// List dead letters, or show one command in full.
    #[command(subcommand, after_help = man::DEAD_LETTERS)]
    DeadLetters(dead_letters::DeadLettersCommand),

    /// Put commands back to pending now (attempts reset, last error kept).
    #[command(after_help = man::REQUEUE)]
    Requeue(requeue::RequeueArgs),

    /// Delete completed commands and/or dead letters, in batches.
    #[command(after_help = man::PURGE)]
    Purge(purge::PurgeArgs),

    /// Schedule a new copy of completed or dead commands; prints the new ids.
    #[command(after_help = man::REPLAY)]
    Replay(replay::ReplayArgs),

    /// Schedule one command, or many from a JSON Lines file.
    #[command(after_help = man::SCHEDULE)]
    Schedule(Box<schedule::ScheduleArgs>),

    /// Pause, resume or list queues for the whole fleet.
    #[command(subcommand)]
    Queue(queue::QueueCommand),

    /// List each source's recurring schedules with their last and next occurrence.
    #[command(after_help = schedules::HELP)]
    Schedules(schedules::SchedulesArgs),

    /// Check each source's health: table size, dead rows, transactions holding back
    /// cleanup, the oldest due command's wait; exit 1 when something needs action.
    #[command(after_help = doctor::HELP)]
    Doctor(doctor::DoctorArgs),

    /// Measure enqueue, drain, idle latency and claim times on a scratch table.
    #[command(after_help = man::BENCH)]
    Bench(bench::BenchArgs),

    /// Serve the operations console in the browser (read-only unless --allow-actions).
    #[command(after_help = console::HELP)]
    Console(console::ConsoleArgs),

    /// Print a shell completion script.
    #[command(after_help = man::COMPLETIONS)]
    Completions(completions::CompletionsArgs),

    /// Check the configuration file without connecting to a database (for CI).
    #[command(subcommand, after_help = man::CONFIG)]
    Config(config::ConfigCommand),

    /// Print the icq(1) man page, or write every page into a directory.
    #[command(after_help = man::MAN)]
    Man(man::ManArgs),

    /// Internal: kills what a worker's exec handlers left running once it is gone.
    #[command(hide = true)]
    ExecWatchdog,
}

impl Cli {
    /// Parses a command line like [`Parser::try_parse_from`], remembering whether
    /// `--format` was given explicitly (`--format table` in a pipe still draws tables).
    pub fn try_parse_args(args: &[std::ffi::OsString]) -> Result<Cli, clap::Error> {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Cli::command().try_get_matches_from(args)?;
        let mut cli =
            Cli::from_arg_matches(&matches).map_err(|err| err.format(&mut Cli::command()))?;
        cli.global.format_given = format_given(&matches);
        Ok(cli)
    }
}

/// Whether `--format` came from the command line, at any subcommand level.
fn format_given(matches: &clap::ArgMatches) -> bool {
    let mut level = Some(matches);
    while let Some(m) = level {
        if m.value_source("format") == Some(clap::parser::ValueSource::CommandLine) {
            return true;
        }
        level = m.subcommand().map(|(_, sub)| sub);
    }
    false
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    crate::cli::output::request_tables(
        cli.global.format_given && cli.global.format == Format::Table,
    );
    exec_watchdog::enable();
    if !matches!(cli.command, Command::Work(_)) {
        connect_warnings_to_stderr(cli.global.format == Format::Json);
    }
    match cli.command {
        Command::Migrate(cmd) => migrate::run(cmd, &cli.global).await,
        Command::Work(args) => work::run(args, &cli.global).await,
        Command::Quickstart(args) => quickstart::run(args, &cli.global).await,
        Command::Pending(args) => pending::run(args, &cli.global).await,
        Command::DeadLetters(cmd) => dead_letters::run(cmd, &cli.global).await,
        Command::List(args) => list::run(args, &cli.global).await,
        Command::Show(args) => show::run(args, &cli.global).await,
        Command::Cancel(args) => cancel::run(args, &cli.global).await,
        Command::Requeue(args) => requeue::run(args, &cli.global).await,
        Command::Purge(args) => purge::run(args, &cli.global).await,
        Command::Replay(args) => replay::run(args, &cli.global).await,
        Command::Schedule(args) => schedule::run(*args, &cli.global).await,
        Command::Schedules(args) => schedules::run(args, &cli.global).await,
        Command::Doctor(args) => doctor::run(args, &cli.global).await,
        Command::Queue(cmd) => queue::run(cmd, &cli.global).await,
        Command::Bench(args) => bench::run(args, &cli.global).await,
        Command::Console(args) => console::run(args, &cli.global).await,
        Command::Completions(args) => completions::run(args),
        Command::Config(cmd) => config::run(cmd, &cli.global),
        Command::Man(args) => man::run(args),
        Command::ExecWatchdog => exec_watchdog::run(),
    }
}

/// Shows on stderr the warnings a command gets while it opens its sources (a secret-looking
/// URL parameter the driver would ignore, named without its value), as `icq work` logs
/// them: every command that connects warns alike. Only the connect warnings: the other
/// commands print no log. `icq work` installs its own log subscriber instead.
fn connect_warnings_to_stderr(json: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let only = tracing_subscriber::filter::Targets::new()
        .with_target("icq::engine::url", tracing::Level::WARN);
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .log_internal_errors(false);
    let registry = tracing_subscriber::registry().with(only);
    // Installed once per process; a second call (tests running commands in-process) keeps
    // the first.
    let _ = if json {
        registry.with(layer.json()).try_init()
    } else {
        registry
            .with(layer.fmt_fields(crate::cli::telemetry::escaping_fields()))
            .try_init()
    };
}

/// A value that must not be empty or blank: `--type ''`, `--roles a,,b`.
fn parse_non_empty(raw: &str) -> Result<String, String> {
    if raw.trim().is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(raw.to_owned())
    }
}

/// The CLI's error or the library's, whichever comes first in the chain.
enum Found<'a> {
    Cli(&'a CliError),
    Library(&'a icq::Error),
}

/// The first error of the chain the CLI classifies (its own, or the library's).
fn classified(err: &anyhow::Error) -> Option<Found<'_>> {
    err.chain().find_map(|cause| {
        cause
            .downcast_ref::<CliError>()
            .map(Found::Cli)
            .or_else(|| cause.downcast_ref::<icq::Error>().map(Found::Library))
    })
}

/// The exit code for an error that reached the binary: the code of the CLI's or the
/// library's error when there is one in the chain, 1 otherwise.
pub fn exit_code(err: &anyhow::Error) -> i32 {
    match classified(err) {
        Some(Found::Cli(cli)) => cli.exit_code(),
        Some(Found::Library(library)) => crate::cli::error::exit_code(library),
        None => 1,
    }
}

/// The message of an error that reached the binary: each error of the chain, joined by
/// `: `, leaving out a cause whose text the message already holds (icq's errors include
/// their source's text and return it from `source()` too). A library error is shown with
/// the CLI's hints ([`crate::cli::error::message`]).
pub fn error_message(err: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in err.chain() {
        let text = match cause.downcast_ref::<icq::Error>() {
            Some(library) => crate::cli::error::message(library),
            None => cause.to_string(),
        };
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

/// The `kind` of the JSON error document for an error that reached the binary: the
/// CLI's or the library's error's kind when there is one in the chain, `io` for a bare
/// I/O error, `runtime` otherwise.
pub fn error_kind(err: &anyhow::Error) -> &'static str {
    match classified(err) {
        Some(Found::Cli(cli)) => cli.kind(),
        Some(Found::Library(library)) => crate::cli::error::kind(library),
        None if err.chain().any(|cause| cause.is::<std::io::Error>()) => "io",
        None => "runtime",
    }
}

impl GlobalArgs {
    /// The source request these options describe.
    pub fn source_request(&self) -> crate::cli::sources::SourceRequest {
        crate::cli::sources::SourceRequest {
            config_path: self.config.clone(),
            database_url: self.database_url.clone(),
            source: self.source.clone(),
        }
    }
}

/// Opens the sources the global options select, as the queues the operator commands
/// act on.
pub async fn open_sources(global: &GlobalArgs) -> anyhow::Result<Vec<icq::Queue>> {
    let sources = crate::cli::sources::open(&global.source_request()).await?;
    Ok(sources.into_iter().map(|source| source.queue).collect())
}
