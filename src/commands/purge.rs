//! `icq purge [--completed] [--dead-letters] [--older-than 7d] [--type T] [--queue Q]
//! [--dry-run]`: delete finished commands in bounded batches.

use std::time::Duration;

use clap::Args;

use super::GlobalArgs;
use crate::cli::output::{self, Confirmation};
use icq::admin::{self, PurgeRequest};

/// Arguments of `icq purge`.
#[derive(Debug, Clone, Args)]
pub struct PurgeArgs {
    /// Delete completed commands.
    #[arg(long)]
    pub completed: bool,

    /// Delete dead letters.
    #[arg(long)]
    pub dead_letters: bool,

    /// Only commands that finished longer ago than this, e.g. 30s, 5m, 12h, 7d.
    #[arg(long, value_name = "AGE", value_parser = crate::cli::parse::parse_duration, allow_hyphen_values = true)]
    pub older_than: Option<Duration>,

    /// Only commands of this type.
    #[arg(long = "type", value_name = "TYPE", value_parser = super::parse_non_empty)]
    pub type_name: Option<String>,

    /// Only commands of this queue (needs a schema version 2 table).
    #[arg(long, value_name = "QUEUE", value_parser = super::pending::parse_queue)]
    pub queue: Option<String>,

    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Confirmation.
    #[command(flatten)]
    pub confirmation: Confirmation,
}

/// Runs `icq purge`.
pub async fn run(args: PurgeArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let sources = super::open_sources(global).await?;
    let result = purge(&args, &sources, global).await;
    admin::close(&sources).await;
    Ok(result?)
}

async fn purge(args: &PurgeArgs, sources: &[icq::Queue], global: &GlobalArgs) -> icq::Result<()> {
    let request = PurgeRequest {
        completed: args.completed,
        dead_letters: args.dead_letters,
        older_than: args.older_than,
        queue: args.queue.clone(),
        type_name: args.type_name.clone(),
    };
    let plan = admin::plan_purge(sources, &request).await?;
    if args.dry_run {
        return output::emit(global.format, &plan.dry_run_report());
    }
    if plan.total() > 0 && !output::confirm(&question(&plan), "", args.confirmation)? {
        output::note("Nothing was deleted.");
        return Ok(());
    }
    let progress = output::progress();
    let report = admin::purge(&plan, progress.as_ref()).await?;
    output::emit(global.format, &report)
}

fn question(plan: &admin::PurgePlan) -> String {
    let report = plan.dry_run_report();
    let mut sources: Vec<&str> = report
        .counts
        .iter()
        .filter(|c| c.count > 0)
        .map(|c| c.source.as_str())
        .collect();
    sources.dedup();
    let noun = if sources.len() == 1 {
        "source"
    } else {
        "sources"
    };
    format!(
        "Delete {}{} from {noun} {}?",
        output::describe_purge(&report.counts),
        output::purge_filter(plan.type_name(), plan.queue()),
        sources.join(", ")
    )
}
