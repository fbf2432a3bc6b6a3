//! `icq queue pause|resume|list`: stop and restart a queue for the whole fleet, and list
//! the queues with their state and counts.

use clap::{Args, Subcommand};

use super::GlobalArgs;
use crate::cli::output;
use icq::admin;

/// Queue subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum QueueCommand {
    /// Pause a queue for every replica: no new starts; scheduling goes on and running
    /// commands finish.
    #[command(after_help = "\
Examples:
  icq queue pause webhooks
  icq queue pause webhooks --source orders --format json

Every replica stops starting the queue's commands: at once on PostgreSQL (a NOTIFY), within
its polling interval elsewhere. Needs a schema version 4 table.

Exit codes:
  0  paused (or already paused)
  1  database error (unreachable, table missing)
  2  usage or configuration error, or a table older than schema version 4")]
    Pause(NameArgs),
    /// Resume a paused queue for every replica.
    #[command(after_help = "\
Examples:
  icq queue resume webhooks

Exit codes:
  0  resumed (or was not paused)
  1  database error (unreachable, table missing)
  2  usage or configuration error, or a table older than schema version 4")]
    Resume(NameArgs),
    /// List the queues: paused or not, due, running and scheduled counts.
    #[command(after_help = "\
Examples:
  icq queue list
  icq queue list --format json

Exit codes:
  0  listed
  1  database error (unreachable, table missing)
  2  usage or configuration error")]
    List,
}

/// Arguments naming one queue.
#[derive(Debug, Clone, Args)]
pub struct NameArgs {
    /// The queue.
    #[arg(value_name = "QUEUE", value_parser = super::pending::parse_queue)]
    pub queue: String,
}

/// Runs a queue subcommand.
pub async fn run(cmd: QueueCommand, global: &GlobalArgs) -> anyhow::Result<()> {
    let sources = super::open_sources(global).await?;
    let result = match cmd {
        QueueCommand::Pause(args) => admin::set_paused(&sources, &args.queue, true)
            .await
            .and_then(|report| output::emit(global.format, &report)),
        QueueCommand::Resume(args) => admin::set_paused(&sources, &args.queue, false)
            .await
            .and_then(|report| output::emit(global.format, &report)),
        QueueCommand::List => admin::queue_list(&sources)
            .await
            .and_then(|report| output::emit(global.format, &report)),
    };
    admin::close(&sources).await;
    Ok(result?)
}
