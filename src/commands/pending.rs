//! `icq pending [--by-type] [--by-queue] [--queue Q]`: how many commands are due,
//! scheduled, running, dead and completed in each source (per queue and/or type).

use clap::Args;

use super::GlobalArgs;
use crate::cli::output;
use icq::admin;

/// Arguments of `icq pending`.
#[derive(Debug, Clone, Args)]
pub struct PendingArgs {
    /// One line per command type instead of one per source.
    #[arg(long)]
    pub by_type: bool,

    /// One line per queue (with --by-type: per queue and type). A schema version 1
    /// table has one queue, `default`.
    #[arg(long)]
    pub by_queue: bool,

    /// Count only commands of this queue (needs a schema version 2 table).
    #[arg(long, value_name = "QUEUE", value_parser = parse_queue)]
    pub queue: Option<String>,
}

/// Runs `icq pending`.
pub async fn run(args: PendingArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let sources = super::open_sources(global).await?;
    let request = admin::PendingRequest {
        by_type: args.by_type,
        by_queue: args.by_queue,
        queue: args.queue,
    };
    let report = admin::pending_with(&sources, &request).await;
    admin::close(&sources).await;
    output::emit(global.format, &report?)?;
    Ok(())
}

/// The value parser of the operator commands' `--queue` filter: a queue name (1 to 128
/// bytes, no control characters, not only whitespace; white space at an end is kept, since
/// the filter matches byte for byte), else a usage error (exit 2) before anything runs.
pub(crate) fn parse_queue(raw: &str) -> Result<String, String> {
    match admin::check_queue_name(raw) {
        Ok(()) => Ok(raw.to_owned()),
        Err(err) => Err(err.to_string()),
    }
}
