//! `icq list [--state S] [--type T] [--queue Q] [--limit N] [--after ID | --before TIME]`: one page of
//! commands in a state, in the state's order, with the id that starts the next page (in a
//! table, the next page's command is a note on stderr: a pipe gets the rows alone).

use chrono::{DateTime, Utc};
use clap::Args;

use super::GlobalArgs;
use crate::cli::output;
use icq::admin;
use icq::admin::ListState;
use icq::command::CommandId;

/// Arguments of `icq list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Which commands, and their order.
    #[arg(long, value_enum, default_value_t = ListState::Pending)]
    pub state: ListState,

    /// Only commands of this type.
    #[arg(long = "type", value_name = "TYPE", value_parser = super::parse_non_empty)]
    pub type_name: Option<String>,

    /// Only commands of this queue (needs a schema version 2 table).
    #[arg(long, value_name = "QUEUE", value_parser = super::pending::parse_queue)]
    pub queue: Option<String>,

    /// Show at most this many, 1 to 10000.
    #[arg(long, value_name = "N", default_value_t = 50,
          value_parser = crate::cli::parse::parse_page_limit)]
    pub limit: u32,

    /// The next page: the commands after this id (the last one of the previous page).
    #[arg(long, value_name = "ID")]
    pub after: Option<CommandId>,

    /// Only commands whose listing time (run at; dead lettered at; processed at) is
    /// earlier than this RFC 3339 instant, e.g. 2026-12-01T00:00:00Z.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub before: Option<DateTime<Utc>>,
}

fn parse_time(raw: &str) -> Result<DateTime<Utc>, String> {
    crate::cli::parse::parse_instant(raw).map_err(|e| e.to_string())
}

/// Runs `icq list`.
pub async fn run(args: ListArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let sources = super::open_sources(global).await?;
    let request = admin::ListRequest {
        state: args.state,
        type_name: args.type_name,
        queue: args.queue,
        limit: args.limit,
        after: args.after,
        before: args.before,
    };
    let result = admin::list(&sources, &request).await.and_then(|report| {
        output::emit(global.format, &report)?;
        if global.format == output::Format::Table
            && let Some(hint) = output::next_page_hint(&report)
        {
            output::note(&hint);
        }
        Ok(())
    });
    admin::close(&sources).await;
    Ok(result?)
}
