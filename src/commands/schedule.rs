//! `icq schedule`: enqueue one command from the command line, or many from a JSON Lines
//! file.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;

use super::GlobalArgs;
use crate::command::{Context, NewCommand, RunAt};
use crate::error::Error;
use crate::{admin, output};

/// Arguments of `icq schedule`.
#[derive(Debug, Clone, Args)]
pub struct ScheduleArgs {
    /// The command type, e.g. orders.send_receipt.
    #[arg(
        long = "type",
        value_name = "TYPE",
        required_unless_present = "from_file",
        value_parser = super::parse_non_empty
    )]
    pub type_name: Option<String>,

    /// The payload: JSON text, @FILE to read it from a file, or @- to read stdin.
    #[arg(
        long,
        value_name = "JSON|@FILE",
        allow_hyphen_values = true,
        required_unless_present = "from_file"
    )]
    pub payload: Option<String>,

    /// Due at this instant (RFC 3339, e.g. 2026-01-31T12:00:00Z) instead of now.
    #[arg(long, value_name = "RFC3339", value_parser = super::parse::parse_instant, conflicts_with = "delay")]
    pub at: Option<DateTime<Utc>>,

    /// Due after this delay instead of now, e.g. 30s, 5m, 12h, 7d.
    #[arg(long = "in", id = "delay", value_name = "DELAY", value_parser = super::parse::parse_duration,
          allow_hyphen_values = true)]
    pub delay: Option<Duration>,

    /// The captured scheduling user.
    #[arg(long, value_name = "U")]
    pub user_id: Option<String>,

    /// The captured roles, comma-separated.
    #[arg(long, value_name = "A,B", value_delimiter = ',', value_parser = super::parse_non_empty)]
    pub roles: Vec<String>,

    /// The captured tenant.
    #[arg(long, value_name = "T")]
    pub tenant_id: Option<String>,

    /// The captured correlation id.
    #[arg(long, value_name = "C")]
    pub correlation_id: Option<String>,

    /// Schedule every line of this JSON Lines file ("-" for stdin); each line is
    /// {"type", "payload", "run_at"?, "user_id"?, "roles"?, "tenant_id"?, "correlation_id"?}.
    #[arg(
        long,
        value_name = "JSONL",
        conflicts_with_all = ["type_name", "payload", "at", "delay", "user_id", "roles", "tenant_id", "correlation_id"]
    )]
    pub from_file: Option<PathBuf>,
}

/// Runs `icq schedule`.
pub async fn run(args: ScheduleArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    // Validate the input before touching any database.
    let input = Input::read(args)?;
    let sources = super::open_sources(global).await?;
    let result = match admin::one_source(&sources) {
        Err(err) => Err(err),
        Ok(source) => match &input {
            Input::One(command) => admin::schedule(source, command)
                .await
                .and_then(|report| output::emit(global.format, &report)),
            Input::Many(commands) => {
                let progress = output::progress();
                admin::schedule_many(source, commands, progress.as_ref())
                    .await
                    .and_then(|report| output::emit(global.format, &report))
            }
        },
    };
    admin::close(&sources).await;
    Ok(result?)
}

/// What to schedule, validated.
enum Input {
    One(NewCommand),
    Many(Vec<NewCommand>),
}

impl Input {
    fn read(args: ScheduleArgs) -> crate::Result<Input> {
        if let Some(path) = args.from_file {
            let (text, origin) = if path.as_os_str() == "-" {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                    .map_err(Error::io("reading commands from stdin"))?;
                (text, "stdin".to_owned())
            } else {
                let origin = path.display().to_string();
                let text = std::fs::read_to_string(&path)
                    .map_err(Error::io(format!("reading {origin}")))?;
                (text, origin)
            };
            return Ok(Input::Many(admin::parse_jobs(&text, &origin)?));
        }
        let (Some(type_name), Some(payload)) = (args.type_name, args.payload) else {
            return Err(Error::Usage(
                "pass --type and --payload, or --from-file".into(),
            ));
        };
        let run_at = match (args.at, args.delay) {
            (Some(at), _) => RunAt::At(at),
            (None, Some(delay)) => RunAt::After(delay),
            (None, None) => RunAt::Now,
        };
        let command = NewCommand::new(type_name, super::parse::read_payload(&payload)?)
            .run_at(run_at)
            .context(Context {
                user_id: args.user_id,
                roles: args.roles,
                tenant_id: args.tenant_id,
                correlation_id: args.correlation_id,
            });
        command.validate()?;
        Ok(Input::One(command))
    }
}
