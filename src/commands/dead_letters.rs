//! `icq dead-letters list|show`: the commands that stopped retrying, and one of them in
//! full.

use clap::{Args, Subcommand};

use super::GlobalArgs;
use crate::cli::output;
use icq::admin;
use icq::command::CommandId;

/// Dead-letter subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum DeadLettersCommand {
    /// List dead letters, newest first: id, type, queue, attempts, when, last error.
    #[command(after_help = "\
Examples:
  icq dead-letters list
  icq dead-letters list --type orders.send_receipt --limit 20 --format json
  icq dead-letters list --queue emails

Exit codes:
  0  listed (an empty list included)
  1  database error (unreachable, table missing)
  2  usage or configuration error")]
    List(ListArgs),
    /// Show one command in full, payload and captured context included.
    #[command(after_help = "\
Examples:
  icq dead-letters show 0b9e6c1e-8d3b-4c55-9a52-1f0a8f4e2b7d
  icq dead-letters show 0b9e6c1e-8d3b-4c55-9a52-1f0a8f4e2b7d --format json

Exit codes:
  0  shown
  1  database error (unreachable, table missing)
  2  usage or configuration error (an empty id, or one longer than 255 characters)
  3  no command has that id

Ids are matched as stored (another writer's `job-1` too); a UUID matches in any case and
with or without braces where the Id column is a uuid (PostgreSQL).")]
    Show(ShowArgs),
}

/// Arguments of `icq dead-letters list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Only dead letters of this command type.
    #[arg(long = "type", value_name = "TYPE", value_parser = super::parse_non_empty)]
    pub type_name: Option<String>,

    /// Only dead letters of this queue (needs a schema version 2 table).
    #[arg(long, value_name = "QUEUE", value_parser = super::pending::parse_queue)]
    pub queue: Option<String>,

    /// Show at most this many (across all sources), 1 to 10000.
    #[arg(long, value_name = "N", default_value_t = admin::DEFAULT_DEAD_LETTER_LIMIT,
          value_parser = crate::cli::parse::parse_page_limit)]
    pub limit: u32,
}

/// Arguments of `icq dead-letters show`.
#[derive(Debug, Clone, Args)]
pub struct ShowArgs {
    /// The command id, as stored (any text up to 255 characters; a UUID in any case or
    /// in braces on PostgreSQL).
    #[arg(value_name = "ID")]
    pub id: CommandId,
}

/// Runs a dead-letters subcommand.
pub async fn run(cmd: DeadLettersCommand, global: &GlobalArgs) -> anyhow::Result<()> {
    let sources = super::open_sources(global).await?;
    let result = match cmd {
        DeadLettersCommand::List(args) => {
            let query = admin::DeadLetterQuery {
                type_name: args.type_name,
                queue: args.queue,
                limit: args.limit,
            };
            admin::dead_letters(&sources, &query)
                .await
                .and_then(|report| output::emit(global.format, &report))
        }
        DeadLettersCommand::Show(args) => admin::show(&sources, args.id)
            .await
            .and_then(|row| output::emit(global.format, &row)),
    };
    admin::close(&sources).await;
    Ok(result?)
}
